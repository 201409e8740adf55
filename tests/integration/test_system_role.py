"""The system database role: workers, the sweeper and the heartbeat
connect as a role with BYPASSRLS (``AGENT_WORKER_SYSTEM_DATABASE_URL``), so the
lap's statements carry no row-level-security policy (``bench.rls``); a
principal's call never runs on it: the API builds its store from
``AGENT_WORKER_DATABASE_URL``, and a system engine refuses a tenant-scoped
transaction outright. The role comes from ``deploy/local/services.sh``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError

import tests.agents  # noqa: F401  (registers "loop")
from agent_worker.api import AgentWorker, DefaultClient
from agent_worker.core.clock import SystemClock
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.principal import Principal
from agent_worker.core.settings import Settings, get_settings
from agent_worker.inprocess import InProcessWorker, LocalQueue
from agent_worker.runtime import Runtime
from agent_worker.store import tenancy
from agent_worker.store.db import make_engine
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.runtime import WorkerRuntime, system_store
from tests.support import unavailable

pytestmark = pytest.mark.integration

ROLE = "agent_worker_system"
ALICE = Principal("acme:alice", "acme", {"submitter", "operator"})
ROOT = Principal("root", "*", {"admin"})


@pytest.fixture(scope="module")
def system_url(database_url: str) -> str:
    """The session's database as the system role (skipped, or failed in CI, without it)."""
    url = make_url(database_url).set(username=ROLE).render_as_string(hide_password=False)
    probe = create_engine(url)
    try:
        with probe.connect() as c:
            bypass = c.execute(text("SELECT rolbypassrls FROM pg_roles "
                                    "WHERE rolname = current_user")).scalar()
    except OperationalError as e:
        unavailable(f"role {ROLE} cannot log in (deploy/local/services.sh creates it): {e}")
    finally:
        probe.dispose()
    assert bypass, f"{ROLE} must have BYPASSRLS"
    return url


@pytest.fixture(scope="module")
def acme_run(database_url: str) -> Iterator[str]:
    w = InProcessWorker(database_url)
    try:
        yield w.acting_as(ALICE).start_run("loop", {"laps": 1},
                                           run_id=f"sys-{uuid.uuid4().hex[:8]}").id
    finally:
        w.close()


def _plan(engine: Engine, sql: str) -> str:
    with engine.connect() as c:
        return "\n".join(r[0] for r in c.execute(text(f"EXPLAIN (COSTS OFF) {sql}")))


def test_the_system_role_plans_no_policy_and_sees_every_tenant(
        database_url: str, system_url: str, acme_run: str) -> None:
    settings = Settings(database_url=database_url, system_database_url=system_url)
    store = system_store(settings)
    app = make_engine(database_url)
    try:
        query = "SELECT * FROM messages WHERE run_id = 'x'"
        assert "current_setting" in _plan(app, query)  # the app role: the policy, every row
        assert "current_setting" not in _plan(store.engine, query)
        with store.engine.connect() as c:
            assert c.execute(text("SELECT current_user")).scalar() == ROLE
            # Not the system scope's '*' doing it: a tenant matching no row changes nothing.
            c.execute(text("SELECT set_config('agent_worker.tenant', 'nobody', false)"))
            assert c.execute(text("SELECT tenant FROM runs WHERE id = :i"),
                             {"i": acme_run}).scalar() == "acme"
            c.invalidate()  # that setting must not go back to the pool
        assert store.get_run(acme_run) is not None
    finally:
        store.dispose()
        app.dispose()


def test_the_system_role_never_serves_a_principal(
        database_url: str, system_url: str, acme_run: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(database_url=database_url, system_database_url=system_url)
    store = system_store(settings)
    aw = AgentWorker(Runtime(store=store, dispatcher=LocalQueue(), settings=settings,
                             clock=SystemClock()))
    try:
        # A principal's verb that reached the system role's connection fails
        # instead of seeing every tenant; the fleet's own (unscoped) work runs.
        with pytest.raises(ConfigurationError, match="bypasses row-level security"):
            aw.acting_as(ALICE).get_run(acme_run)
        with pytest.raises(ConfigurationError), tenancy.scope("acme"):
            store.list_runs(limit=10)
        assert aw.acting_as(ROOT).get_run(acme_run).tenant == "acme"
    finally:
        aw.rt.close()
    # Even when the system role is given as the app's URL by mistake: the
    # connection knows its role bypasses the policies.
    misconfigured = SqlStore(system_url)
    try:
        assert not tenancy.is_system(misconfigured.engine)
        with pytest.raises(ConfigurationError, match="bypasses"), tenancy.scope("acme"):
            misconfigured.list_runs(limit=10)
    finally:
        misconfigured.dispose()
    # Configured from the environment: the API as the app role, workers as the system role.
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", database_url)
    monkeypatch.setenv("AGENT_WORKER_SYSTEM_DATABASE_URL", system_url)
    get_settings.cache_clear()
    api_side, workers = DefaultClient(), WorkerRuntime()
    try:
        api_engine = api_side.get().rt.store.engine  # type: ignore[attr-defined]
        assert api_engine.url.username == make_url(database_url).username != ROLE
        assert not tenancy.is_system(api_engine)
        assert api_side.get().acting_as(ALICE).get_run(acme_run).tenant == "acme"
        worker_engine = workers.get().store.engine  # type: ignore[attr-defined]
        assert worker_engine.url.username == ROLE and tenancy.is_system(worker_engine)
    finally:
        api_side.close()
        workers.close()
        get_settings.cache_clear()
