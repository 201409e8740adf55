"""The fleet's views through the principal rules of runs, on Postgres as the
app role: a tenant's principal sees its own tenant's queues and fair-share
limits only, through the API and the CLI; a principal with no role reads
neither them nor its tenant's schedules (``list_runs``' rule); the metrics,
every tenant's figures at once, need a principal across tenants.

Tenants are named per test module, so the lines of other tests' runs in the
session's database never match.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

import agent_worker.api as api
from agent_worker.agent import Agent, register
from agent_worker.core.errors import PermissionDeniedError
from agent_worker.core.principal import Principal, default_principal
from agent_worker.core.settings import get_settings
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel

pytestmark = pytest.mark.integration

register(Agent(name="fleet-views", model=lambda: ScriptedModel.by_lap([], final="done")))

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"
ADMIN = Principal("root", "*", {"admin"})
ACME_OPS = Principal("acme:ops", ACME, {"operator"})
ACME_NOBODY = Principal("acme:nobody", ACME, ())
CLI = Callable[..., tuple[int, Any, str]]


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
        database_url: str) -> Iterator[CLI]:
    """``cli(principal, *argv)``: ``agent-worker ... --json`` in this process,
    acting as the principal ``AGENT_WORKER_PRINCIPAL_*`` names."""
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", database_url)

    def call(who: Principal, *argv: str) -> tuple[int, Any, str]:
        from agent_worker.cli import main  # as the console script does, after the env is set

        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_ID", who.id)
        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_TENANT", who.tenant)
        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_ROLES", ",".join(sorted(who.roles)))
        get_settings.cache_clear()
        api.configure(worker.acting_as(default_principal(get_settings())))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main([*argv, "--json"])
        return code, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue()

    yield call
    api.configure(None)
    get_settings.cache_clear()


def test_the_cli_shows_a_tenant_its_own_queues_and_limits(cli: CLI) -> None:
    code, out, _ = cli(ACME_OPS, "queues")
    assert code == 0 and {q["tenant"] for q in out["queues"]} == {ACME}
    code, out, _ = cli(ACME_OPS, "share", "list")
    assert code == 0 and {r["tenant"] for r in out["limits"]} == {ACME}
    code, out, _ = cli(ADMIN, "share", "list")
    assert code == 0 and _ours(r["tenant"] for r in out["limits"]) == {ACME, GLOBEX}
    for argv in (("queues",), ("share", "list"), ("schedules", "list")):
        code, _, err = cli(ACME_NOBODY, *argv)
        assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied", argv


def test_the_metrics_are_read_across_tenants_only(cli: CLI) -> None:
    code, _, err = cli(ACME_OPS, "metrics", "--once")
    assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied"
    assert "every tenant" in json.loads(err)["error"]["message"]
    code, out, _ = cli(ADMIN, "metrics", "--once")
    assert code == 0 and "agent_worker_runs" in out
