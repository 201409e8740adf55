"""The lap's hot statements on Postgres, sent by psycopg itself (issue 21 goal 1).

Every lap sends three statements (the claim, the journal of the model's
output, the lap commit). Through SQLAlchemy each paid its execution layer on
top of the driver's work: an execution context, a compiled-cache lookup,
bind and result processing, a result object built from the cursor's
description (about a fifth of the lap's client CPU in a profile). Here the
*same* SQLAlchemy statements (``store.statements``, ``store.lapcommit``: one
description stays the source of truth) are compiled by SQLAlchemy once per
process into the very SQL text it sends itself, and run on the psycopg
connection under the caller's SQLAlchemy ``Connection`` as server-side
prepared statements.

What must not change does not:

- values are converted as SQLAlchemy's column types convert them, explicitly
  (``store.pgtypes``; a type it does not name is refused at compile time);
- the statement runs on the connection the pool handed the caller, in its
  state (autocommit on the lap path, the relaxed or the durable engine);
- a driver error is raised as the SQLAlchemy exception SQLAlchemy would have
  raised, and a disconnect invalidates the connection and the pool as
  SQLAlchemy does, so ``store.retry`` retries exactly what it retried before;
- inside a tenant scope (``store.tenancy``: SQLAlchemy's ``begin`` hook
  refuses a scoped transaction on a connection that bypasses row-level
  security) and on any other dialect or driver the statement goes through
  SQLAlchemy, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler

from store import tenancy
from store.pgtypes import Converter, bind_converter, result_converter


def rows(conn: Connection, statement: Executable,
         params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every row ``statement`` returns, as mappings by column name."""
    plan = _plan(conn, statement, params)
    if plan is None:
        return [cast(Mapping[str, Any], row)
                for row in conn.execute(statement, params).mappings()]
    return [plan.mapping(row) for row in _run(conn, plan, params)]


def first(conn: Connection, statement: Executable,
          params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first row ``statement`` returns, or ``None``."""
    found = rows(conn, statement, params)
    return found[0] if found else None


def scalar(conn: Connection, statement: Executable, params: Mapping[str, Any]) -> Any:
    """The one value of the one row ``statement`` returns."""
    plan = _plan(conn, statement, params)
    if plan is None:
        return conn.execute(statement, params).scalar_one()
    (row,) = _run(conn, plan, params)
    (value,) = plan.mapping(row).values()
    return value


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


def _plan(conn: Connection, statement: Executable,
          params: Mapping[str, Any]) -> _Plan | None:
    """The plan to run ``statement`` through psycopg on ``conn``, or ``None``
    to run it through SQLAlchemy (not psycopg, or inside a tenant scope)."""
    dialect = conn.dialect
    if dialect.driver != "psycopg" or tenancy.current() is not None:
        return None
    key = (statement, type(dialect), dialect.server_version_info)
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = _Compiled(statement, dialect)
    return compiled.plan(params)


def _run(conn: Connection, plan: _Plan, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    pg: psycopg.Connection[tuple[Any, ...]] = conn.connection.driver_connection  # type: ignore[assignment]
    try:
        return pg.execute(plan.sql, plan.values(params), prepare=True).fetchall()
    except Exception as e:
        raise _translated(conn, e, plan.text) from e


def _translated(conn: Connection, e: Exception, sql: str) -> StatementError:
    """``e`` as SQLAlchemy raises it (``Connection._handle_dbapi_exception``):
    a driver error as the ``DBAPIError`` subclass ``store.retry`` decides on,
    a value its type refused (a naive datetime) as a ``StatementError``,
    parameters hidden as the engine hides them; on a disconnect, this
    connection invalidated and the pool told to recycle every connection
    older than now (a Postgres restart killed them all: without it, each
    retry of ``store.retry`` would draw the next dead connection)."""
    dialect = conn.dialect
    fairy = conn.connection
    disconnect = isinstance(e, psycopg.Error) and bool(
        dialect.is_disconnect(cast(Any, e), fairy.dbapi_connection, None))
    if disconnect:
        conn.engine.pool._invalidate(fairy, e)
        conn.invalidate(e)
    return DBAPIError.instance(
        sql, None, e, psycopg.Error, hide_parameters=conn.engine.hide_parameters,
        connection_invalidated=disconnect, dialect=dialect)


__all__ = ["first", "rows", "scalar"]
