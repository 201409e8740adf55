"""Listing runs by labels, status, agent, version, tenant and creation time,
newest first, paged with an opaque cursor (issue 18, item 5).

The cursor is keyset paging on ``(created_at, id)`` (index ``ix_runs_created``),
never an OFFSET: a page costs the same at page 1 and page 10,000, and runs
started while a client pages do not shift what it has still to see. Labels
match by containment: ``labels @> '{"k": "v"}'`` on Postgres (a GIN index,
``jsonb_path_ops``), ``json_extract`` on SQLite (in-process mode, small).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB

from agent_worker.errors import InvalidInputError
from agent_worker.vocabulary import RunStatus
from store.base import RunRecord
from store.rows import runs, to_run
from store.runstatus import status_is


@dataclass(frozen=True)
class RunFilter:
    """What to list; every field narrows (``None``: any)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    status: RunStatus | None = None
    agent: str | None = None
    agent_version: str | None = None
    tenant: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass(frozen=True)
class RunPage:
    """One page of runs, newest first; ``next_cursor`` is ``None`` on the last."""

    runs: list[RunRecord]
    next_cursor: str | None


def encode_cursor(run: RunRecord) -> str:
    """Where the page after ``run`` starts; opaque to callers."""
    raw = json.dumps([run.created_at.isoformat(), run.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ``InvalidInputError`` for anything ``encode_cursor`` did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, run_id = json.loads(raw)
        when = datetime.fromisoformat(at)
        if not isinstance(run_id, str) or when.tzinfo is None:
            raise ValueError("not a cursor")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as e:
        raise InvalidInputError(f"invalid cursor {cursor[:80]!r}: not one a listing "
                                "returned") from e
    return when, run_id


def _query(conn: Connection, f: RunFilter, after: tuple[datetime, str] | None,
           limit: int) -> Select[Any]:
    q = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
    if f.labels:
        if conn.dialect.name == "postgresql":
            q = q.where(runs.c.labels.op("@>")(
                bindparam("labels", dict(f.labels), type_=JSONB)))
        else:
            for key, value in f.labels.items():
                # Keys are identifiers (letters, digits, . _ -): safe inside a quoted path.
                q = q.where(func.json_extract(runs.c.labels, f'$."{key}"') == value)
    if f.status is not None:
        q = q.where(status_is(f.status))
    equal: tuple[tuple[Any, str | None], ...] = (
        (runs.c.agent_name, f.agent),
        (runs.c.agent_version, f.agent_version), (runs.c.tenant, f.tenant))
    for column, wanted in equal:
        if wanted is not None:
            q = q.where(column == wanted)
    if f.created_after is not None:
        q = q.where(runs.c.created_at >= f.created_after)
    if f.created_before is not None:
        q = q.where(runs.c.created_at < f.created_before)
    if after is not None:
        q = q.where(tuple_(runs.c.created_at, runs.c.id) < tuple_(
            bindparam("after_at", after[0], type_=runs.c.created_at.type),
            bindparam("after_id", after[1])))
    return q


def search_runs(conn: Connection, f: RunFilter, *, cursor: str | None, limit: int) -> RunPage:
    """One page of the runs matching ``f`` (one query)."""
    after = decode_cursor(cursor) if cursor is not None else None
    rows = [to_run(r) for r in conn.execute(_query(conn, f, after, limit + 1))]
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(rows, encode_cursor(rows[-1]) if more and rows else None)


__all__ = ["RunFilter", "RunPage", "decode_cursor", "encode_cursor", "search_runs"]
