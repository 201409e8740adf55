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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Connection, Engine, event, text

#: The setting the policies read, and its value for "every tenant".
SETTING = "agent_worker.tenant"
SYSTEM = "*"

_current: ContextVar[str | None] = ContextVar("agent_worker_tenant_scope", default=None)
_NARROW = text(f"SELECT set_config('{SETTING}', :tenant, true)")


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


def install(engine: Engine) -> None:
    """Narrow each transaction of ``engine`` begun inside ``scope(tenant)``."""

    @event.listens_for(engine, "begin")
    def _narrow(conn: Connection) -> None:
        tenant = _current.get()
        # Autocommit (the lap's hot path): a transaction-local setting would
        # end with this very statement, so it would only cost a round trip.
        if tenant is not None and \
                conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn.execute(_NARROW, {"tenant": tenant})


__all__ = ["SETTING", "SYSTEM", "current", "install", "scope", "system_connect_args"]
