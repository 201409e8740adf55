"""The database's clock, for every comparison that decides who owns a run.

Leases, timers and timeouts used to compare the calling worker's wall clock
with timestamps other workers wrote: a worker whose clock ran ahead by more
than the lease TTL took live leases, one running behind had its own lease
recovered under it. They now read the one clock every worker
shares, the database's, so a worker's clock does not matter.

On Postgres that is ``now()`` (the transaction's start, the same in every
statement of a sweep), as naive UTC like the columns. SQLite is embedded in
the single process of the in-process mode: its own current time is that
process's clock, which the caller passes as ``now`` (tests inject one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from agent_worker.store.models import UTCDateTime


class db_now(FunctionElement[datetime]):
    """``db_now(local)``: the database's time; ``db_now(local, seconds)``: that
    time plus ``seconds``. ``local`` is the caller's value of the same instant,
    used only where the database has no clock of its own (SQLite)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"


@compiles(db_now)
def _local(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    local: ColumnElement[Any] = next(iter(element.clauses))
    return compiler.process(local, **kw)


@compiles(db_now, "postgresql")
def _postgres(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # now() unqualified, so a test database can put its own clock first on the
    # search_path (tests/conftest.py moves the database's time that way).
    sql = "timezone('UTC', now())"
    clauses = list(element.clauses)
    if len(clauses) > 1:
        sql = f"({sql} + make_interval(secs => {compiler.process(clauses[1], **kw)}))"
    return sql


def db_time(local: datetime, seconds: float | None = None) -> db_now:
    """``db_now`` with literal values, for statements built per call."""
    args: list[Any] = [bindparam(None, local, type_=UTCDateTime())]
    if seconds is not None:
        args.append(bindparam(None, seconds))
    return db_now(*args)


def read_now(conn: Connection, local: datetime) -> datetime:
    """The database's current time (timezone-aware UTC), for a transaction that
    compares many rows against one instant."""
    value: datetime = conn.execute(
        select(db_now(bindparam("local", local, type_=UTCDateTime())))).scalar_one()
    return value


__all__ = ["db_now", "db_time", "read_now"]
