"""Where one attempt of a lap's hot statement runs.

On Postgres the connection is the pool's own checkout (``hotsql.checkout``),
with no SQLAlchemy ``Connection`` around it: through ``Engine.connect()``
with the ``AUTOCOMMIT`` execution option (set on checkout, reset on return)
a checkout cost about 20 µs more CPU, three times a lap, for statements that
need none of it (each of the lap's statements runs alone, in autocommit). A
lap that needs more than its one statement (a claim that cannot start from
the lap cache, a journal that finds an earlier attempt's output) asks for
``sql()``: SQLAlchemy's ``Connection`` on the very same pooled connection,
which from then on sends everything. So no attempt ever holds two
connections of one pool: a threads worker's laps each holding one and
waiting for a second could otherwise drain it.

Elsewhere (SQLite, whose lap runs in one transaction; a tenant scope, see
``hotsql.applies``) a ``HotConnection`` wraps the SQLAlchemy ``Connection``
the caller opened, and everything goes through SQLAlchemy as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import Executable

from agent_worker.store import hotsql


class HotConnection:
    """One pooled connection for one attempt of a lap's statements."""

    def __init__(self, engine: Engine, pooled: PoolProxiedConnection | None = None,
                 sql: Connection | None = None) -> None:
        self._engine = engine
        self._pooled = pooled
        self._sql = sql

    def first(self, statement: Executable,
              params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The first row ``statement`` returns, by column name, or ``None``."""
        found = self.rows(statement, params)
        return found[0] if found else None

    def scalar(self, statement: Executable, params: Mapping[str, Any]) -> Any:
        """The one value of the one row ``statement`` returns."""
        (row,) = self.rows(statement, params)
        (value,) = row.values()
        return value

    def rows(self, statement: Executable,
             params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Every row ``statement`` returns, by column name."""
        if self._sql is None and self._pooled is not None:
            return list(hotsql.run(self._engine, self._pooled, statement, params))
        return [cast(Mapping[str, Any], row)
                for row in self.sql().execute(statement, params).mappings()]

    def sql(self) -> Connection:
        """SQLAlchemy's ``Connection`` on this same pooled connection, in
        autocommit, for whatever else the attempt sends."""
        if self._sql is None:
            self._sql = Connection(self._engine, connection=self._pooled).execution_options(
                isolation_level="AUTOCOMMIT")
        return self._sql


@contextmanager
def pooled(engine: Engine) -> Iterator[HotConnection]:
    """A ``HotConnection`` on a connection of ``engine``'s pool (Postgres
    through psycopg, ``hotsql.applies``), given back at the end."""
    connection = hotsql.checkout(engine)
    hot = HotConnection(engine, pooled=connection)
    try:
        yield hot
    finally:
        if hot._sql is not None:
            hot._sql.close()  # SQLAlchemy took it over: it gives it back
        else:
            hotsql.release(connection)


def over(conn: Connection) -> HotConnection:
    """A ``HotConnection`` sending everything through ``conn``."""
    return HotConnection(conn.engine, sql=conn)


__all__ = ["HotConnection", "over", "pooled"]
