"""Which tenant's rows a database transaction may touch (Postgres row-level security).

Every tenant-owned table has a policy (migration ``0003_tenancy``) that shows
a row only when the setting ``agent_worker.tenant`` is the row's tenant (for
the child tables: when the row's run is visible) or ``*``; ``FORCE ROW LEVEL
SECURITY`` subjects the owning app role to it too. A connection that never
sets it (a raw ``psql`` as the app role, a tool that forgot) sees no tenant row.

Two ways it is set, so the lap path pays nothing for it:

- **System scope, per connection.** Every engine ``store.db.make_engine``
  builds for Postgres starts its sessions with ``agent_worker.tenant=*`` in the
  connection's startup options: workers, the sweeper and the retention task
  run any tenant's laps (the lap message names a run, never a tenant, and the
  claim's fence is unchanged), at no round trip per lap.
- **A principal's tenant, per transaction.** The public API runs each verb
  inside ``scope(tenant)``; while it is active, every transaction the store
  begins first runs ``set_config('agent_worker.tenant', tenant, true)``
  (transaction-local), so a query that forgot its tenant filter still sees only
  that tenant's rows. The API filters explicitly as well (SQLite has no RLS).

The policies still cost every statement of a lap their evaluation (a few
percent, BENCHMARKS.md). So workers, the sweeper and the heartbeat may connect
as a **system role** instead (``AGENT_WORKER_SYSTEM_DATABASE_URL``: a role with
``BYPASSRLS``, a member of the app role; ``deploy/local/services.sh`` creates
it), for which Postgres plans no policy at all. An engine built for it is
marked (``make_engine(..., system=True)``) and refuses any transaction begun
inside ``scope(tenant)``, as does any connection whose role turns out to
bypass the policies (``install``): a principal's verb that reached such a
connection would see every tenant, so it fails instead of leaking.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from weakref import WeakSet

from sqlalchemy import Connection, Engine, event, text

from agent_worker.core.errors import ConfigurationError

#: The setting the policies read, and its value for "every tenant".
SETTING = "agent_worker.tenant"
SYSTEM = "*"

_current: ContextVar[str | None] = ContextVar("agent_worker_tenant_scope", default=None)
_NARROW = text(f"SELECT set_config('{SETTING}', :tenant, true)")
#: Whether the connection's role skips every policy (``connection.info`` key).
_BYPASS_KEY = "agent_worker_bypasses_rls"
_BYPASSES = "SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user"
#: Engines connected as the system role (row-level security bypassed).
_system_engines: WeakSet[Engine] = WeakSet()


@contextmanager
def scope(tenant: str | None) -> Iterator[None]:
    """Narrow every transaction begun inside to ``tenant`` (``None`` or ``*``:
    leave the connection's system scope)."""
    token = _current.set(None if tenant == SYSTEM else tenant)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> str | None:
    """The tenant the current context is narrowed to, if any."""
    return _current.get()


def system_connect_args(connect_args: dict[str, Any]) -> dict[str, Any]:
    """``connect_args`` with the system scope added to the startup options."""
    options = connect_args.get("options", "")
    return {**connect_args, "options": f"{options} -c {SETTING}={SYSTEM}".strip()}


def is_system(engine: Engine) -> bool:
    """Whether ``engine`` was built for the system role (``install(system=True)``)."""
    return engine in _system_engines


def install(engine: Engine, *, system: bool = False) -> None:
    """Narrow each transaction of ``engine`` begun inside ``scope(tenant)``;
    with ``system`` (the engine connects as the system role, which bypasses
    row-level security), refuse such a transaction instead.

    Each new connection also asks whether its role bypasses row-level
    security (``BYPASSRLS`` or superuser): then the policies could not narrow
    anything, so a tenant-scoped transaction is refused on it too, whichever
    URL led there (``AGENT_WORKER_DATABASE_URL`` pointed at the system role).

    Raises (from the transaction's begin):
        ConfigurationError: a tenant-scoped transaction on a system engine or
            a connection whose role bypasses row-level security.
    """
    if system:
        _system_engines.add(engine)

    @event.listens_for(engine, "connect")
    def _role(dbapi_conn: Any, record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(_BYPASSES)
        record.info[_BYPASS_KEY] = bool(cur.fetchone()[0])
        cur.close()
        if not dbapi_conn.autocommit:  # leave no transaction open on a fresh connection
            dbapi_conn.rollback()

    @event.listens_for(engine, "begin")
    def _narrow(conn: Connection) -> None:
        tenant = _current.get()
        if tenant is not None and (system or conn.info.get(_BYPASS_KEY)):
            raise ConfigurationError(
                "this database role bypasses row-level security (the system role, or a "
                "superuser) and serves workers only; a principal's call must connect "
                "through AGENT_WORKER_DATABASE_URL as the app role")
        # Autocommit (the lap's hot path): a transaction-local setting would
        # end with this very statement, so it would only cost a round trip.
        if tenant is not None and \
                conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn.execute(_NARROW, {"tenant": tenant})


__all__ = ["SETTING", "SYSTEM", "current", "install", "is_system", "scope",
           "system_connect_args"]
