"""Every table that holds a tenant's rows has a forced row-level-security
policy (issue 48, finding 3; migration ``0024_append_only_audit``):
``rate_charges`` and ``event_followers`` had none, so with the tenant setting
on tenant A, tenant B's charges and followed runs were readable. The writers
of both still work: admission and the lap's charge correction in the system
scope, a stream reader's registration in its principal's tenant or the
system scope.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

import tests.agents  # noqa: F401  (registers "loop")
from agent_worker.core.principal import Principal
from agent_worker.inprocess import InProcessWorker
from agent_worker.store import ratelimit, tenancy
from agent_worker.store.db import make_engine
from agent_worker.store.streamfeed import PgEventWaiter

pytestmark = pytest.mark.integration

#: Columns that make a table a tenant's: its own tenant, or a run's.
TENANT_COLUMNS = ("tenant", "run_id", "child_run_id")
#: Tables with such a column that are the fleet's configuration, not a
#: tenant's data (``0010_tenant_tables``): per-tenant fair-share limits, with
#: tenant ``*`` every tenant's default, read by every admission pass.
FLEET_CONFIGURATION = {"share_limits"}

ALICE = Principal("acme:alice", "acme", {"submitter", "operator"})


@pytest.fixture(scope="module")
def acme_run(database_url: str) -> Iterator[str]:
    w = InProcessWorker(database_url)
    try:
        yield w.acting_as(ALICE).start_run("loop", {"laps": 1},
                                           run_id=f"pol-{uuid.uuid4().hex[:8]}").id
    finally:
        w.close()


@pytest.fixture
def app(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)  # the app role, system scope unless narrowed
    yield engine
    engine.dispose()


def test_every_table_with_a_tenant_column_has_a_forced_policy(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as c:
            tables = {r.table_name: r for r in c.execute(text(
                "SELECT t.table_name, k.relrowsecurity, k.relforcerowsecurity, "
                "  (SELECT count(*) FROM pg_policies p WHERE p.schemaname = t.table_schema "
                "   AND p.tablename = t.table_name AND p.cmd = 'ALL' "
                "   AND p.qual LIKE '%agent_worker.tenant%') AS policies "
                "FROM (SELECT DISTINCT table_schema, table_name FROM information_schema.columns "
                "      WHERE table_schema = current_schema() AND column_name = ANY(:cols)) t "
                "JOIN pg_class k ON k.oid = format('%I.%I', t.table_schema, t.table_name)"
                "::regclass WHERE k.relkind IN ('r', 'p')"), {"cols": list(TENANT_COLUMNS)})}
    finally:
        engine.dispose()
    assert {"runs", "audit_log", "rate_charges", "event_followers"} <= set(tables)
    assert set(tables) >= FLEET_CONFIGURATION  # an exemption names a table that exists
    unguarded = sorted(name for name, r in tables.items() if name not in FLEET_CONFIGURATION
                       and not (r.relrowsecurity and r.relforcerowsecurity and r.policies))
    assert unguarded == []


def test_tenant_b_reads_none_of_tenant_as_charges_or_followers(
        database_url: str, app: Engine, acme_run: str) -> None:
    follower = uuid.uuid4().hex
    with app.begin() as c:  # what admission and a reader write, in the system scope
        c.execute(text("INSERT INTO rate_charges (run_id, lap, tenant, provider, at, tokens) "
                       "VALUES (:r, 1, 'acme', 'openai', timezone('UTC', now()), 10)"),
                  {"r": acme_run})
        c.execute(text("INSERT INTO event_followers (follower, run_id, expires_at) "
                       "VALUES (:f, :r, timezone('UTC', now()) + interval '1 minute')"),
                  {"f": follower, "r": acme_run})
    raw = create_engine(database_url)  # the app role, as psql would connect
    queries = {"rate_charges": "SELECT count(*) FROM rate_charges WHERE run_id = :r",
               "event_followers": "SELECT count(*) FROM event_followers WHERE run_id = :r"}
    try:
        for tenant, seen in ((None, 0), ("globex", 0), ("acme", 1), ("*", 1)):
            with raw.connect() as c:
                if tenant is not None:
                    c.execute(text("SELECT set_config('agent_worker.tenant', :t, false)"),
                              {"t": tenant})
                got = {t: c.execute(text(q), {"r": acme_run}).scalar() for t, q in queries.items()}
            assert got == dict.fromkeys(queries, seen), tenant
        # Nor write them: B's UPDATE and DELETE find nothing.
        with tenancy.scope("globex"), app.begin() as c:
            assert c.execute(text("UPDATE rate_charges SET tokens = 0 WHERE run_id = :r"),
                             {"r": acme_run}).rowcount == 0
            assert c.execute(text("DELETE FROM event_followers WHERE run_id = :r"),
                             {"r": acme_run}).rowcount == 0
    finally:
        raw.dispose()


def test_charges_are_written_in_the_system_scope_and_only_the_tenants_own_in_its(
        app: Engine, acme_run: str) -> None:
    charge = {"run_id": acme_run, "lap": 7, "tenant": "acme", "provider": None, "tokens": 5}
    with app.begin() as c:  # admission's charge and the lap commit's correction
        ratelimit.charge(c, [charge], now=datetime.now(UTC))
        ratelimit.correct(c, {**charge, "tokens": 42}, now=datetime.now(UTC))
    with tenancy.scope("acme"), app.begin() as c:
        ratelimit.correct(c, {**charge, "tokens": 43}, now=datetime.now(UTC))
        assert c.execute(text("SELECT tokens FROM rate_charges WHERE run_id = :r AND lap = 7"),
                         {"r": acme_run}).scalar() == 43
    with pytest.raises(DBAPIError, match="row-level security"), \
            tenancy.scope("acme"), app.begin() as c:
        ratelimit.charge(c, [{**charge, "lap": 8, "tenant": "globex"}], now=datetime.now(UTC))


def _followers(app: Engine, run_id: str) -> int:
    with app.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM event_followers WHERE run_id = :r "
                                  "AND expires_at > timezone('UTC', now())"),
                             {"r": run_id}).scalar_one())


def test_a_stream_reader_registers_in_its_tenant_or_the_system_scope(
        app: Engine, acme_run: str) -> None:
    before = _followers(app, acme_run)
    for tenant in (None, "acme"):
        with tenancy.scope(tenant):
            waiter = PgEventWaiter(app, acme_run)
        try:
            assert _followers(app, acme_run) == before + 1
            assert waiter.wait(0.01) in (True, False)  # renews and settles as before
        finally:
            waiter.close()
        assert _followers(app, acme_run) == before
    # Another tenant's principal cannot register as a follower of acme's run.
    with pytest.raises(Exception, match="row-level security"), tenancy.scope("globex"):
        PgEventWaiter(app, acme_run)
    assert _followers(app, acme_run) == before
