"""Tenancy on real Postgres: tenant B can neither see nor act on tenant
A's runs, approvals, effects, signals or audit entries, through the API or the
CLI; run ids that collide across tenants are refused without a word about the
other run; a non-member's decision is refused and audited; a raw query as the
app role without a tenant sees no tenant row; the audit log is append-only and
lists each action exactly once.

Laps run in this process (``InProcessWorker`` on the session's Postgres): no
fleet, so the module takes seconds. The CLI runs in-process with the principal
taken from ``AGENT_WORKER_PRINCIPAL_*``, once as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from agent_worker.agent import Agent, register
from agent_worker.control import wait_for_signal_tool
from agent_worker.core.errors import (
    NotFoundError,
    PermissionDeniedError,
    RunIdUnavailableError,
    UnknownRunError,
)
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.core.principal import Principal
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.store import tenancy
from agent_worker.store.db import make_engine
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext, tool
from tests.principals import PrincipalCli, cli_as
from tests.support import ROOT

pytestmark = pytest.mark.integration


@tool(kind="irreversible")
def close_account(account: str, ctx: ToolContext) -> dict[str, str]:
    """Irreversible: a member of acme-ops approves every call."""
    return {"closed": account}


def _desk(r: ModelRequest) -> ModelResponse:
    # Lap 2 makes the approved call (no model call); lap 3 waits for "go".
    if r.lap == 1:
        return turn("closing", [("close_account", {"account": "acct-1"})])
    if r.lap <= 3:
        return turn("waiting", [("wait_for_signal", {"name": "go"})])
    return turn("done")


register(Agent(name="tenancy-desk", model=lambda: ScriptedModel(_desk),
               tools=[close_account, wait_for_signal_tool], approval_owner="acme-ops"))

ALICE = Principal("acme:alice", "acme", {"submitter", "approver", "operator", "acme-ops"})
MALLORY = Principal("acme:mallory", "acme", {"approver", "submitter"})
GLOBEX = Principal("globex:eve", "globex", {"submitter", "approver", "operator", "acme-ops"})


@pytest.fixture(scope="module")
def worker(database_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(database_url)
    yield w
    w.close()


@pytest.fixture(scope="module")
def acme_run(worker: InProcessWorker) -> str:
    """One acme run, waiting on its approval (laps: 1 asked)."""
    run = worker.acting_as(ALICE).start_run("tenancy-desk", run_id=_id("acme"))
    worker.run_until_idle()
    assert worker.acting_as(ALICE).get_run(run.id).status == "waiting"
    return run.id


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_tenant_b_neither_sees_nor_acts_on_tenant_a_through_the_api(
        worker: InProcessWorker, acme_run: str) -> None:
    b = worker.acting_as(GLOBEX)
    approval = worker.acting_as(ALICE).list_approvals(run_id=acme_run)[0]
    key = approval.effect_key
    assert [r.id for r in b.list_runs(limit=1000) if r.id == acme_run] == []
    assert b.list_runs(tenant="acme") == []
    assert b.list_approvals() == [] and b.list_approvals(run_id=acme_run) == []
    unknown: list[Callable[[], Any]] = [
        lambda: b.get_run(acme_run), lambda: b.send_signal(acme_run, "go"),
        lambda: b.cancel(acme_run, reason="x"), lambda: b.retry(acme_run),
        lambda: b.raise_budget(acme_run, max_laps=9), lambda: b.fork(acme_run, 0),
        lambda: b.effects(acme_run), lambda: b.messages(acme_run),
        lambda: b.events(acme_run), lambda: b.checkpoints(acme_run),
        lambda: b.state_at(acme_run, 0), lambda: b.audit(run_id=acme_run)]
    for call in unknown:
        with pytest.raises(UnknownRunError) as e:
            call()
        assert "acme" not in str(e.value).replace(acme_run, "")
    # Deciding by run id or approval id, resolving its effect: not found either.
    for call in (lambda: b.approve(acme_run), lambda: b.approve(approval.id),
                 lambda: b.reject(approval.id), lambda: b.resolve_effect(key, applied=True)):
        with pytest.raises(NotFoundError):
            call()
    assert not [e for e in b.audit(limit=1000) if e.tenant == "acme"]
    # Nothing changed for acme: still waiting on that approval.
    a = worker.acting_as(ALICE)
    assert a.get_run(acme_run).status == "waiting"
    assert [x.status for x in a.list_approvals(run_id=acme_run)] == ["pending"]


def test_run_id_collisions_across_tenants_reveal_nothing(
        worker: InProcessWorker, acme_run: str) -> None:
    b = worker.acting_as(GLOBEX)
    with pytest.raises(RunIdUnavailableError) as e:
        b.start_run("tenancy-desk", run_id=acme_run)
    assert "acme" not in str(e.value).replace(acme_run, "")
    assert "tenancy-desk" not in str(e.value)
    mine = b.start_run("tenancy-desk", run_id=_id("globex"))
    with pytest.raises(RunIdUnavailableError):  # a fork may not take it either
        b.fork(mine.id, 0, new_run_id=acme_run)
    admin = worker.acting_as(Principal("root", "*", {"admin"}))
    with pytest.raises(RunIdUnavailableError):  # not even an admin, into another tenant
        admin.start_run("tenancy-desk", run_id=acme_run, tenant="globex")
    # An admin naming no tenant retries a start it sees: the same run, idempotent.
    assert admin.start_run("tenancy-desk", run_id=acme_run).tenant == "acme"
    with pytest.raises(PermissionDeniedError):  # a tenant principal names only its own
        b.start_run("tenancy-desk", tenant="acme")
    assert worker.acting_as(ALICE).get_run(acme_run).tenant == "acme"
    assert admin.get_run(mine.id).tenant == "globex"


def test_a_non_member_decision_is_refused_and_recorded(
        worker: InProcessWorker, acme_run: str) -> None:
    with pytest.raises(PermissionDeniedError, match="acme-ops"):
        worker.acting_as(MALLORY).approve(acme_run)
    with pytest.raises(PermissionDeniedError):  # retry needs the operator role
        worker.acting_as(MALLORY).retry(acme_run)
    a = worker.acting_as(ALICE)
    refused = [e for e in a.audit(principal=MALLORY.id, limit=1000)]
    assert Counter((e.action, e.outcome) for e in refused) == {
        ("approve", "refused"): 1, ("retry", "refused"): 1}
    assert all(e.tenant == "acme" and e.run_id == acme_run for e in refused)
    assert [x.status for x in a.list_approvals(run_id=acme_run)] == ["pending"]


def test_a_raw_query_without_a_tenant_sees_no_tenant_row(
        database_url: str, worker: InProcessWorker, acme_run: str) -> None:
    tables = ("runs", "checkpoints", "messages", "effects", "events", "approvals",
              "signals", "audit_log", "state_edits", "child_runs", "schedules")
    raw = create_engine(database_url)  # the app role, nothing set: what psql would see
    system = make_engine(database_url)
    try:
        with raw.connect() as c:
            assert {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in tables} \
                == dict.fromkeys(tables, 0)
            c.execute(text("SELECT set_config('agent_worker.tenant', 'acme', false)"))
            seen = {r[0] for r in c.execute(text("SELECT DISTINCT tenant FROM runs"))}
            assert seen == {"acme"}
        with system.connect() as c:
            assert c.execute(text("SELECT count(*) FROM runs WHERE id = :i"),
                             {"i": acme_run}).scalar() == 1
        # What the API does around every verb: a store query that names no
        # tenant still sees only the scope's.
        with tenancy.scope("acme"):
            assert {r.tenant for r in worker.rt.store.list_runs(limit=10_000)} == {"acme"}
            assert worker.rt.store.list_approvals(status="pending", limit=10_000)
    finally:
        raw.dispose()
        system.dispose()


def test_raw_sql_through_a_principals_connection_stays_in_its_tenant(
        worker: InProcessWorker, acme_run: str) -> None:
    """What a verb of tenant B's principal runs on its connection, even SQL that
    names A's run outright, neither reads nor writes A's rows: the policies,
    not the API's filters, refuse it."""
    engine = worker.rt.store.engine  # type: ignore[attr-defined]
    acme = {"i": acme_run}
    with tenancy.scope(GLOBEX.tenant), engine.begin() as c:
        for table, column in (("runs", "id"), ("messages", "run_id"), ("events", "run_id"),
                              ("approvals", "run_id"), ("checkpoints", "run_id")):
            assert c.execute(text(f"SELECT count(*) FROM {table} WHERE {column} = :i"),
                             acme).scalar() == 0, table
        assert c.execute(text("UPDATE runs SET status = 'cancelled' WHERE id = :i"),
                         acme).rowcount == 0
        assert c.execute(text("DELETE FROM approvals WHERE run_id = :i"), acme).rowcount == 0
    with pytest.raises(DBAPIError, match="row-level security"), \
            tenancy.scope(GLOBEX.tenant), engine.begin() as c:
        c.execute(text("INSERT INTO signals (run_id, name, created_at) "
                       "VALUES (:i, 'go', now())"), acme)
    assert worker.acting_as(ALICE).get_run(acme_run).status == "waiting"
    assert [x.status for x in worker.acting_as(ALICE).list_approvals(run_id=acme_run)] \
        == ["pending"]


def test_the_audit_log_refuses_update_and_delete(database_url: str, acme_run: str) -> None:
    system = make_engine(database_url)
    try:
        for sql in ("UPDATE audit_log SET principal = 'someone-else'",
                    "DELETE FROM audit_log", "TRUNCATE audit_log"):
            with pytest.raises(DBAPIError, match="append-only"), system.begin() as c:
                c.execute(text(sql))
    finally:
        system.dispose()


# --- the CLI --------------------------------------------------------------------------------


@pytest.fixture
def cli(worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch,
        database_url: str) -> Iterator[PrincipalCli]:
    """``cli(principal, *argv)``: ``agent-worker`` in this process, acting as the
    principal ``AGENT_WORKER_PRINCIPAL_*`` names (laps run in ``worker``)."""
    with cli_as(worker, monkeypatch, database_url, settle=True) as call:
        yield call


def test_through_the_cli_each_action_is_audited_once_and_b_sees_none_of_it(
        cli: Callable[..., tuple[int, Any, str]], database_url: str) -> None:
    alice = Principal(f"acme:alice-{uuid.uuid4().hex[:6]}", "acme", ALICE.roles)
    run_id = _id("cli-acme")
    assert cli(alice, "submit", "tenancy-desk", "--run-id", run_id)[0] == 0
    code, _, err = cli(MALLORY, "approve", run_id)
    assert code == 5 and json.loads(err)["error"]["code"] == "permission_denied"
    assert cli(alice, "approve", run_id, "--comment", "checked")[1]["decided_by"] == alice.id
    assert cli(alice, "signal", run_id, "go")[0] == 0
    assert cli(alice, "fork", run_id, "--lap", "1", "--run-id", f"{run_id}-f")[0] == 0
    assert cli(alice, "cancel", f"{run_id}-f", "--reason", "not needed")[0] == 0
    # Tenant B: nothing of it is there.
    assert run_id not in {r["id"] for r in cli(GLOBEX, "runs", "list", "--limit", "1000")[1]}
    for argv in (("runs", "show", run_id), ("effects", "list", run_id),
                 ("signal", run_id, "go"), ("cancel", run_id, "--reason", "x"),
                 ("audit", "--run", run_id)):
        assert cli(GLOBEX, *argv)[0] == 3, argv
    assert cli(GLOBEX, "approvals", "list", "--status", "approved")[1] == []
    assert not [e for e in cli(GLOBEX, "audit", "--limit", "10000")[1]
                if e["tenant"] == "acme"]
    # Alice's actions, each exactly once, under her name; and the refusal once.
    mine = cli(alice, "audit", "--principal", alice.id, "--limit", "1000")[1]
    assert Counter(e["action"] for e in mine) == {"start": 1, "approve": 1, "signal": 1,
                                                  "fork": 1, "cancel": 1}
    assert all(e["outcome"] == "ok" and e["tenant"] == "acme" for e in mine)
    refused = cli(alice, "audit", "--run", run_id, "--principal", MALLORY.id)[1]
    assert [(e["action"], e["outcome"]) for e in refused] == [("approve", "refused")]
    # The same, read by a fresh `agent-worker` process configured only by its environment.
    env = {**os.environ, "AGENT_WORKER_DATABASE_URL": database_url,
           "AGENT_WORKER_PRINCIPAL_ID": "globex:auditor", "AGENT_WORKER_PRINCIPAL_TENANT":
           "globex", "AGENT_WORKER_PRINCIPAL_ROLES": "operator",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "agent_worker.cli", "runs", "show", run_id,
                           "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3 and json.loads(done.stderr)["error"]["code"] == "unknown_run"


def test_the_audit_log_is_pruned_only_past_the_ledger_retention(
        database_url: str, worker: InProcessWorker, acme_run: str) -> None:
    """The one DELETE the trigger lets through: the retention prune's, of rows
    older than the cutoff it declares (the ledger's retention)."""
    system = make_engine(database_url)
    now = worker.rt.clock.now()
    try:
        with system.begin() as c:
            old_id = c.execute(text(
                "INSERT INTO audit_log (at, tenant, principal, action, outcome) VALUES "
                "(timezone('UTC', now()) - interval '400 days', 'acme', 'old', 'start', 'ok') "
                "RETURNING id")).scalar_one()
        kept = len(worker.audit(limit=10_000))
        assert isinstance(worker.rt.store, SqlStore)
        pruned = worker.rt.store.prune(checkpoints_before=now - timedelta(days=7),
                                       ledger_before=now - timedelta(days=365), batch=100)
        assert pruned["audit_log"] == 1
        assert old_id not in {e.id for e in worker.audit(limit=10_000)}
        assert len(worker.audit(limit=10_000)) == kept - 1
    finally:
        system.dispose()
