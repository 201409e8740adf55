"""The SQLAlchemy store's plumbing: one engine, transactions that retry, and
the relaxed-durability engine the Postgres lap path uses (see ``SqlBase``).
Helpers named ``_x(conn, ...)`` never commit; each public method owns exactly
one transaction and retries it when the database blips (``store.retry``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.pool import QueuePool

from agent_worker.store import audit, tenancy
from agent_worker.store.db import make_engine
from agent_worker.store.dbtime import read_now
from agent_worker.store.retry import with_retry

T = TypeVar("T")


class SqlBase:
    """The engine and transaction plumbing under ``SqlStore``.

    On Postgres the lap's hot path skips explicit transactions: the claim, the
    journaled model output and a plain lap commit are each one statement (or
    independent statements) run in autocommit, saving the BEGIN/COMMIT round
    trips. The claim and the journal also run with ``synchronous_commit=off``
    and need not survive a database crash on their own: every later write is
    fenced on the lease the claim set (a lost claim makes the lap stop with
    ``LeaseLost``); a tool with a side effect runs only after its intent's
    synchronous commit, which flushes the WAL up to it, journal included; and
    the lap commit writes the journaled message again (a no-op unless the crash
    lost it). So a lap pays one fsync, not three. The chaos suite's Postgres
    ``-m immediate`` restart is the test of this. A lap that only read pays
    none: its commit runs on the relaxed engine too (``LapCommit.durable``;
    docs/reference/guarantees.md says what a crash can then cost).
    """

    def __init__(self, engine: Engine | str) -> None:
        self.engine = make_engine(engine) if isinstance(engine, str) else engine
        self._relaxed: Engine | None = None

    def dispose(self) -> None:
        """Close every pooled connection (at process exit or test teardown)."""
        self.engine.dispose()
        if self._relaxed is not None:
            self._relaxed.dispose()

    def _autocommit(self, fn: Callable[[Connection], T], *, durable: bool) -> T:
        """Run ``fn`` statement by statement in autocommit (Postgres), each of
        them atomic on its own; elsewhere, as one ordinary transaction."""
        if self.engine.dialect.name != "postgresql":
            return self._tx(fn)

        def attempt() -> T:
            with (self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                  if durable else self._relaxed_engine().connect()) as conn:
                return fn(conn)

        return with_retry(attempt)

    def _relaxed_engine(self) -> Engine:
        if self._relaxed is None:
            # Kept as many as the main engine keeps: a threads worker's journal
            # writes would otherwise open and close a connection per lap. In
            # autocommit for good (it serves ``_autocommit`` only): switching
            # every checkout into autocommit and back cost each claim and
            # journal CPU.
            pool = self.engine.pool
            kept = max(2, pool.size()) if isinstance(pool, QueuePool) else 2
            self._relaxed = make_engine(
                self.engine.url.render_as_string(hide_password=False), pool_size=kept,
                system=tenancy.is_system(self.engine), isolation_level="AUTOCOMMIT",
                connect_args={"options": "-c synchronous_commit=off"})
        return self._relaxed

    def _tx(self, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with self.engine.begin() as conn:
                out = fn(conn)
                # An operator verb's audit entry commits with what it did (store.audit).
                audit.write_pending(conn)
                return out

        out = with_retry(attempt)
        audit.committed()
        return out

    def _read(self, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with self.engine.connect() as conn:
                return fn(conn)

        return with_retry(attempt)

    def current_time(self) -> datetime:
        """The database's clock (``store.dbtime``): what ``DatabaseClock`` reads."""
        return self._read(lambda c: read_now(c, datetime.now(UTC)))


__all__ = ["SqlBase"]
