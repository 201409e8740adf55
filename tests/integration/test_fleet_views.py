"""The fleet's views through the principal rules of runs, on Postgres as the
app role: a tenant's principal sees its own tenant's queues and fair-share
limits only, through the API and the CLI; a principal with no role reads
neither them nor its tenant's schedules (``list_runs``' rule); the metrics,
every tenant's figures at once, need a principal across tenants.

Tenants are named per test module, so the lines of other tests' runs in the
session's database never match.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent_worker.agent import Agent, register
from agent_worker.core.errors import PermissionDeniedError
from agent_worker.core.principal import Principal
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel
from tests.principals import PrincipalCli, cli_as

pytestmark = pytest.mark.integration

register(Agent(name="fleet-views", model=lambda: ScriptedModel.by_lap([], final="done")))

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"
ADMIN = Principal("root", "*", {"admin"})
ACME_OPS = Principal("acme:ops", ACME, {"operator"})
ACME_NOBODY = Principal("acme:nobody", ACME, ())


@pytest.fixture(scope="module")
def worker(database_url: str) -> Iterator[InProcessWorker]:
    """Queued runs of both tenants (no lap runs: they stay in the queues), a
    limit and a schedule each."""
    w = InProcessWorker(database_url)
    admin = w.acting_as(ADMIN)
    for tenant in (ACME, GLOBEX):
        admin.start_run("fleet-views", tenant=tenant)
        admin.set_share(tenant, concurrency=3, weight=2)
        admin.schedule(f"nightly-{tenant}", "fleet-views", tenant=tenant, paused=True)
    yield w
    for tenant in (ACME, GLOBEX):
        admin.clear_share(tenant)
        admin.delete_schedule(f"nightly-{tenant}")
    w.close()


def _ours(tenants: Any) -> set[str]:
    return {t for t in tenants if t in (ACME, GLOBEX)}


def test_a_tenants_principal_sees_its_own_queues_and_limits_only(
        worker: InProcessWorker) -> None:
    assert _ours(q.tenant for q in worker.acting_as(ADMIN).queues()) == {ACME, GLOBEX}
    assert _ours(r.tenant for r in worker.acting_as(ADMIN).share_limits()) == {ACME, GLOBEX}
    ops = worker.acting_as(ACME_OPS)
    assert {q.tenant for q in ops.queues()} == {ACME}
    # Not another tenant's rows, nor the fleet's '*' defaults an operator set.
    assert {r.tenant for r in ops.share_limits()} == {ACME}


def test_a_principal_with_no_role_reads_no_queue_limit_or_schedule(
        worker: InProcessWorker) -> None:
    nobody = worker.acting_as(ACME_NOBODY)
    for call in (nobody.queues, nobody.share_limits, nobody.list_schedules,
                 lambda: nobody.get_schedule(f"nightly-{ACME}")):
        with pytest.raises(PermissionDeniedError):
            call()
    refused = worker.acting_as(ADMIN).audit(principal=ACME_NOBODY.id, limit=100)
    assert len(refused) >= 4 and {e.outcome for e in refused} == {"refused"}
    # Its operator reads them, its own tenant's only.
    ops = worker.acting_as(ACME_OPS)
    assert [s.name for s in ops.list_schedules()] == [f"nightly-{ACME}"]
    assert ops.get_schedule(f"nightly-{ACME}").tenant == ACME


@pytest.fixture
def cli(worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
        database_url: str) -> Iterator[PrincipalCli]:
    """``cli(principal, *argv)``: ``agent-worker ... --json`` in this process,
    acting as the principal ``AGENT_WORKER_PRINCIPAL_*`` names."""
    with cli_as(worker, monkeypatch, database_url) as call:
        yield call


def test_the_cli_shows_a_tenant_its_own_queues_and_limits(cli: PrincipalCli) -> None:
    code, out, _ = cli(ACME_OPS, "queues")
    assert code == 0 and {q["tenant"] for q in out["queues"]} == {ACME}
    code, out, _ = cli(ACME_OPS, "share", "list")
    assert code == 0 and {r["tenant"] for r in out["limits"]} == {ACME}
    code, out, _ = cli(ADMIN, "share", "list")
    assert code == 0 and _ours(r["tenant"] for r in out["limits"]) == {ACME, GLOBEX}
    for argv in (("queues",), ("share", "list"), ("schedules", "list")):
        code, _, err = cli(ACME_NOBODY, *argv)
        assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied", argv


def test_the_metrics_are_read_across_tenants_only(cli: PrincipalCli) -> None:
    code, _, err = cli(ACME_OPS, "metrics", "--once")
    assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied"
    assert "every tenant" in json.loads(err)["error"]["message"]
    code, out, _ = cli(ADMIN, "metrics", "--once")
    assert code == 0 and "agent_worker_runs" in out
