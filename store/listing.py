"""Listing runs by labels, status, agent, version, tenant and creation time,
newest first, paged with an opaque cursor.

The cursor is keyset paging on ``(created_at, id)`` (index ``ix_runs_created``),
never an OFFSET: a page costs the same at page 1 and page 10,000, and runs
started while a client pages do not shift what it has still to see.

Labels match through their rows in ``run_labels`` (``store.labelrows``), on
Postgres and SQLite alike. One label: the statement walks that label's index
entries (``ix_run_labels_tenant`` for a tenant, else ``ix_run_labels_pair``)
newest first and joins each to its run, so it stops after a page however
common the label. Several: one ``EXISTS`` each, and the planner starts from
the rarest (it has the statistics; a caller's order says nothing). Why not
``labels @> ...`` on the run row: under the forced row-level security of a
deployed database that operator is not leakproof, so Postgres never used its
GIN index (BENCHMARKS.md, "Listings under row-level security at a million
runs").
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, bindparam, exists, select, tuple_

from agent_worker.errors import InvalidInputError
from agent_worker.store.base import RunRecord
from agent_worker.store.labelrows import run_labels
from agent_worker.store.rows import runs, to_run
from agent_worker.store.runstatus import status_is
from agent_worker.vocabulary import RunStatus


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


def _label_rows(f: RunFilter, key: str, value: str) -> list[ColumnElement[bool]]:
    """Conditions on ``run_labels`` for one label (and the filter's tenant, so
    the tenant's index serves a principal's search)."""
    cond = [run_labels.c.key == key, run_labels.c.value == value]
    if f.tenant is not None:
        cond.append(run_labels.c.tenant == f.tenant)
    return cond


def _query(conn: Connection, f: RunFilter, after: tuple[datetime, str] | None,
           limit: int) -> Select[Any]:
    # ``conn`` is kept for callers that compile the statement (bench.labels).
    order: tuple[Any, Any] = (runs.c.created_at, runs.c.id)
    q = select(runs)
    pairs = list(f.labels.items())
    if len(pairs) == 1:
        # Walk the label's own index in listing order: its created_at and
        # run_id are the run's, so the page is the first rows of that walk.
        q = q.join_from(run_labels, runs, runs.c.id == run_labels.c.run_id).where(
            *_label_rows(f, *pairs[0]))
        order = (run_labels.c.created_at, run_labels.c.run_id)
    else:
        for key, value in pairs:
            q = q.where(exists().where(run_labels.c.run_id == runs.c.id,
                                       *_label_rows(f, key, value)))
    q = q.order_by(order[0].desc(), order[1].desc()).limit(limit)
    if f.status is not None:
        q = q.where(status_is(f.status))
    equal: tuple[tuple[Any, str | None], ...] = (
        (runs.c.agent_name, f.agent),
        (runs.c.agent_version, f.agent_version), (runs.c.tenant, f.tenant))
    for column, wanted in equal:
        if wanted is not None:
            q = q.where(column == wanted)
    if f.created_after is not None:
        q = q.where(order[0] >= f.created_after)
    if f.created_before is not None:
        q = q.where(order[0] < f.created_before)
    if after is not None:
        q = q.where(tuple_(*order) < tuple_(
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
