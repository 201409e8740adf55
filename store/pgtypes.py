"""The value conversions SQLAlchemy's column types make on Postgres, made
explicitly for the statements ``store.hotsql`` sends through psycopg itself.

SQLAlchemy converts every bound value through its type's bind processor and
every returned value through its result processor. A statement that skips
SQLAlchemy's execution layer must do the same conversions or it writes other
bytes: a naive datetime where ``UTCDateTime`` would refuse one, JSON with
``json.dumps``'s spaces, SQL ``NULL`` where SQLAlchemy's ``JSON`` writes the
JSON ``null``. So each type a hot statement binds or returns is named here
with what it does, and any other type with a SQLAlchemy processor is refused
when the statement is compiled (``bind_converter``/``result_converter``
raise), never silently passed through. ``tests/store/test_hot_statements.py``
checks each conversion against SQLAlchemy's own processor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.types.json import Json, Jsonb
from sqlalchemy import JSON, Boolean
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import elements
from sqlalchemy.types import TypeEngine

from agent_worker.store.db import compact_json
from agent_worker.store.models import UTCDateTime

#: One value in, the value psycopg is given (or the caller gets) out.
Converter = Callable[[Any], Any]


def bind_converter(type_: TypeEngine[Any], dialect: Dialect) -> Converter | None:
    """How a value bound as ``type_`` is handed to psycopg (``None``: as it is).

    Raises:
        TypeError: ``type_`` converts values in SQLAlchemy and is not named here.
    """
    impl = type_.dialect_impl(dialect)
    if isinstance(type_, UTCDateTime):
        return _utc_bind(type_, dialect)
    if isinstance(impl, postgresql.JSONB):
        return _json_bind(impl, Jsonb)
    if isinstance(impl, JSON):
        return _json_bind(impl, Json)
    if isinstance(impl, Boolean):
        return _boolean
    if impl.bind_processor(dialect) is None:
        return None
    raise TypeError(f"no explicit bind conversion for {type_!r}; add it to store.pgtypes")


def result_converter(type_: TypeEngine[Any], dialect: Dialect) -> Converter | None:
    """How a value psycopg returned for a column of ``type_`` is handed out
    (``None``: as it is; psycopg itself parses JSON, as under SQLAlchemy).

    Raises:
        TypeError: ``type_`` converts results in SQLAlchemy and is not named here.
    """
    if isinstance(type_, UTCDateTime):
        return _utc_result(type_, dialect)
    # Any type code: SQLAlchemy's psycopg processors do not look at it.
    if type_.dialect_impl(dialect).result_processor(dialect, None) is None:
        return None
    raise TypeError(f"no explicit result conversion for {type_!r}; add it to store.pgtypes")


def _utc_bind(type_: UTCDateTime, dialect: Dialect) -> Converter:
    # The type's own method: aware in, naive UTC to the column; naive refused.
    return lambda value: type_.process_bind_param(value, dialect)


def _utc_result(type_: UTCDateTime, dialect: Dialect) -> Converter:
    return lambda value: type_.process_result_value(value, dialect)


def _json_bind(type_: JSON, wrapper: type[Json] | type[Jsonb]) -> Converter:
    """As SQLAlchemy's ``JSON``: ``None`` is the JSON ``null`` unless the type
    says ``none_as_null``; ``null()`` is SQL ``NULL``. Serialized compactly,
    as every engine of ``store.db`` does."""
    none_as_null = type_.none_as_null

    def convert(value: Any) -> Any:
        if value is JSON.NULL:
            value = None
        elif isinstance(value, elements.Null) or (value is None and none_as_null):
            return None
        return wrapper(value, compact_json)

    return convert


def _boolean(value: Any) -> bool | None:
    """As SQLAlchemy's ``Boolean``: ``None``, or what equals ``True`` or
    ``False`` (so 1 and 0 too) as a ``bool``; another number is a
    ``ValueError``, anything else a ``TypeError``."""
    if value is None:
        return None
    if value in (True, False):
        return bool(value)
    if isinstance(value, int):
        raise ValueError(f"value {value!r} is not None, True, or False")
    raise TypeError(f"not a boolean value: {value!r}")


__all__ = ["Converter", "bind_converter", "result_converter"]
