"""The lap's hot statements on Postgres, sent by psycopg itself.

Every lap sends three statements (the claim, the journal of the model's
output, the lap commit). Through SQLAlchemy each paid its execution layer on
top of the driver's work: an execution context, a compiled-cache lookup,
bind and result processing, a result object built from the cursor's
description (about a fifth of the lap's client CPU in a profile). Here the
*same* SQLAlchemy statements (``store.statements``, ``store.lapcommit``: one
description stays the source of truth) are compiled by SQLAlchemy once per
process into the very SQL text it sends itself, and run on a pooled psycopg
connection as server-side prepared statements (``store.hotconn`` checks it
out). Through SQLAlchemy psycopg prepared them too, from their sixth
execution on (its ``prepare_threshold``); now from the first, and still
never on a connection whose ``prepare_threshold`` is ``None``.

What must not change does not:

- values are converted as SQLAlchemy's column types convert them, explicitly
  (``store.pgtypes``; a type it does not name is refused at compile time);
- a driver error is raised as the SQLAlchemy exception SQLAlchemy would have
  raised, and a disconnect invalidates the connection and the pool as
  SQLAlchemy does, so ``store.retry`` retries exactly what it retried before;
- inside a tenant scope (``store.tenancy``: SQLAlchemy's ``begin`` hook
  narrows the transaction, or refuses it on a connection that bypasses
  row-level security) and on any other dialect or driver, ``applies`` says
  no and SQLAlchemy sends the statement, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler

from agent_worker.store import tenancy
from agent_worker.store.pgtypes import Converter, bind_converter, result_converter


def applies(engine: Engine) -> bool:
    """Whether psycopg itself may send the hot statements on ``engine`` now:
    Postgres through psycopg, outside any tenant scope."""
    return engine.dialect.driver == "psycopg" and tenancy.current() is None


def checkout(engine: Engine) -> PoolProxiedConnection:
    """A connection of ``engine``'s pool in autocommit, without SQLAlchemy's
    ``Connection`` around it; give it back with ``release``. Raises as
    ``Engine.connect()`` would (a server that is restarting: retriable)."""
    try:
        connection = engine.raw_connection()
    except psycopg.Error as e:
        raise _translated(engine, None, e, None) from e
    try:
        _driver(connection).autocommit = True
    except psycopg.Error as e:
        error = _translated(engine, connection, e, None)
        if connection.is_valid:  # not a disconnect: back to the pool as it came
            connection.close()
        raise error from e
    return connection


def release(connection: PoolProxiedConnection) -> None:
    """Give back a connection from ``checkout`` as SQLAlchemy expects its
    pool's connections: out of autocommit. One a disconnect invalidated is
    back in the pool already (``_translated``)."""
    if not connection.is_valid:
        return
    try:
        _driver(connection).autocommit = False
    except psycopg.Error as e:  # it died meanwhile: never hand it out again
        connection.invalidate(e)
        return
    connection.close()


def run(engine: Engine, connection: PoolProxiedConnection, statement: Executable,
        params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Send ``statement`` with ``params`` on ``connection`` (checked out of
    ``engine``'s pool, in the transaction state the caller set) and return
    its rows as mappings by column name. Raises as SQLAlchemy would
    (``_translated``)."""
    plan = _plan(engine.dialect, statement, params)
    try:
        found = _driver(connection).execute(plan.sql, plan.values(params),
                                            prepare=True).fetchall()
    except Exception as e:
        raise _translated(engine, connection, e, plan.text) from e
    return [plan.mapping(row) for row in found]


def _driver(connection: PoolProxiedConnection) -> psycopg.Connection[tuple[Any, ...]]:
    return cast("psycopg.Connection[tuple[Any, ...]]", connection.driver_connection)


@dataclass(frozen=True)
class _Plan:
    """One statement ready for psycopg: its SQL text, the values it always
    binds (literals of the statement, converted), where each other value
    comes from in the caller's parameters, and how to convert the result."""

    text: str
    sql: bytes
    fixed: Mapping[str, Any]
    #: (name in the SQL, caller's parameter, index into it if expanded, conversion)
    from_caller: tuple[tuple[str, str, int | None, Converter | None], ...]
    columns: tuple[str, ...]
    results: tuple[tuple[int, Converter], ...]

    def values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(self.fixed)
        for name, source, index, convert in self.from_caller:
            value = params[source] if index is None else params[source][index]
            values[name] = value if convert is None else convert(value)
        return values

    def mapping(self, row: Sequence[Any]) -> dict[str, Any]:
        out = dict(zip(self.columns, row, strict=True))
        for i, convert in self.results:
            name = self.columns[i]
            out[name] = convert(out[name])
        return out


class _Compiled:
    """A statement compiled for one dialect, with a plan per shape of its
    expanding parameters (the served versions' ``IN`` list, by length)."""

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        self.dialect = dialect
        element = cast(ClauseElement, statement)
        self.compiled = cast(SQLCompiler, element.compile(dialect=dialect))
        by_name: dict[str, Any] = {}
        for bind, name in self.compiled.bind_names.items():
            by_name.setdefault(name, []).append(bind)
        self.binds = by_name
        self.expanding = tuple(sorted(name for name, binds in by_name.items()
                                      if binds[0].required and binds[0].expanding))
        exported = cast(Any, statement).exported_columns
        self.columns = tuple(str(c.key) for c in exported)
        self.column_types = [c.type for c in exported]
        self.plans: dict[tuple[int, ...], _Plan] = {}

    def plan(self, params: Mapping[str, Any]) -> _Plan:
        shape = tuple(len(params[name]) for name in self.expanding)
        found = self.plans.get(shape)
        if found is None:
            found = self.plans[shape] = self._build(shape)
        return found

    def _convert(self, name: str) -> Converter | None:
        """The one conversion of parameter ``name`` (every bind of that name
        must convert alike: they take one value)."""
        found = [(type(b.type), bind_converter(b.type, self.dialect)) for b in self.binds[name]]
        kinds = {kind for kind, convert in found if convert is not None}
        if len(kinds) > 1 or (kinds and any(convert is None for _, convert in found)):
            raise TypeError(f"parameter {name!r} is bound as {[k for k, _ in found]}, "
                            "which convert its value differently")
        return next((convert for _, convert in found if convert is not None), None)

    def _build(self, shape: tuple[int, ...]) -> _Plan:
        dummies: dict[str, Any] = {
            name: None for name, binds in self.binds.items() if binds[0].required}
        dummies.update({name: [None] * n for name, n in zip(self.expanding, shape, strict=True)})
        state = self.compiled.construct_expanded_state(dummies)
        origin = {expanded: (name, i) for name, names in state.parameter_expansion.items()
                  for i, expanded in enumerate(names)}
        fixed: dict[str, Any] = {}
        from_caller: list[tuple[str, str, int | None, Converter | None]] = []
        for name, value in state.parameters.items():
            source, index = origin.get(name, (name, None))
            convert = self._convert(source)
            if self.binds[source][0].required:
                from_caller.append((name, source, index, convert))
            else:
                fixed[name] = value if convert is None else convert(value)
        results = tuple((i, c) for i, c in enumerate(
            result_converter(t, self.dialect) for t in self.column_types) if c is not None)
        return _Plan(text=state.statement, sql=state.statement.encode(), fixed=fixed,
                     from_caller=tuple(from_caller), columns=self.columns, results=results)


#: Compiled statements by (statement, dialect class, server version): what
#: SQLAlchemy's rendering depends on. The statements are module constants.
_compiled: dict[tuple[Executable, type[Dialect], Any], _Compiled] = {}


def _plan(dialect: Dialect, statement: Executable, params: Mapping[str, Any]) -> _Plan:
    key = (statement, type(dialect), dialect.server_version_info)
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = _Compiled(statement, dialect)
    return compiled.plan(params)


def _translated(engine: Engine, connection: PoolProxiedConnection | None, e: Exception,
                sql: str | None) -> StatementError:
    """``e`` as SQLAlchemy raises it (``Connection._handle_dbapi_exception``,
    or ``_handle_dbapi_exception_noconnection`` when there is no connection
    yet): a driver error as the ``DBAPIError`` subclass ``store.retry``
    decides on, a value its type refused (a naive datetime) as a
    ``StatementError``, parameters hidden as the engine hides them. On a
    disconnect the connection is invalidated (which also returns it to the
    pool) and the pool told to recycle every connection older than now: a
    Postgres restart killed them all, and without it each retry of
    ``store.retry`` would draw the next dead one."""
    dialect = engine.dialect
    disconnect = isinstance(e, psycopg.Error) and connection is not None and bool(
        dialect.is_disconnect(cast(Any, e), connection.dbapi_connection, None))
    if disconnect:
        engine.pool._invalidate(cast(Any, connection), e)
    return DBAPIError.instance(
        sql, None, e, psycopg.Error, hide_parameters=engine.hide_parameters,
        connection_invalidated=disconnect, dialect=dialect)


__all__ = ["applies", "checkout", "release", "run"]
