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

A search term (``RunFilter.text``: a run id prefix, an agent name, a label
value, or words of a run's error) has no index to walk: those are four
columns in two tables, and an index on the error text (trigram) would be
written by every failing lap. So a term is checked on at most
``SEARCH_WINDOW`` runs per page: the statement first finds the run that many
places further along the listing's own index (an index-only read), then
keeps the matching runs up to it. A page costs the same on a million-run
table as on a small one; one with fewer matches than asked still hands out a
cursor (past the window) while older runs remain, so paging on reaches every
match.

Pages run newest first, or oldest first (``oldest=True``): the same index
walked the other way.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    bindparam,
    exists,
    or_,
    select,
    tuple_,
)

from agent_worker.core.errors import InvalidInputError
from agent_worker.core.vocabulary import RunStatus
from agent_worker.store.base import RunRecord
from agent_worker.store.labelrows import run_labels
from agent_worker.store.rows import runs, to_run
from agent_worker.store.runstatus import status_is

#: How many runs (matching the other filters) one page of a search term reads
#: at most; see the module docstring.
SEARCH_WINDOW = 2000
#: The longest search term (a run id is at most 200 characters).
MAX_SEARCH_CHARS = 200


@dataclass(frozen=True)
class RunFilter:
    """What to list; every field narrows (``None``: any). ``text`` is a
    search term: a run matches when its id starts with it, its agent is
    named it, one of its labels has it as value, or its error message
    contains it (case-insensitive); ``%``, ``_`` and backslashes are plain
    characters."""

    labels: Mapping[str, str] = field(default_factory=dict)
    status: RunStatus | None = None
    agent: str | None = None
    agent_version: str | None = None
    tenant: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    text: str | None = None


@dataclass(frozen=True)
class RunPage:
    """One page of runs, newest first; ``next_cursor`` is ``None`` on the last."""

    runs: list[RunRecord]
    next_cursor: str | None


def encode_cursor(run: RunRecord) -> str:
    """Where the page after ``run`` starts; opaque to callers."""
    return _cursor(run.created_at, run.id)


def _cursor(at: datetime, run_id: str) -> str:
    raw = json.dumps([at.isoformat(), run_id], separators=(",", ":"))
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
    return _ordered(f, after, limit, oldest=False)[0]


def _ordered(f: RunFilter, after: tuple[datetime, str] | None, limit: int, *,
             oldest: bool) -> tuple[Select[Any], tuple[Any, Any]]:
    """The listing without the search term, and the two columns it is ordered by."""
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
    if oldest:
        q = q.order_by(order[0].asc(), order[1].asc())
    else:
        q = q.order_by(order[0].desc(), order[1].desc())
    q = q.limit(limit)
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
        mark = tuple_(bindparam("after_at", after[0], type_=runs.c.created_at.type),
                      bindparam("after_id", after[1]))
        q = q.where(tuple_(*order) > mark if oldest else tuple_(*order) < mark)
    return q, order


def _matches(text: str) -> ColumnElement[bool]:
    """A run the term finds; ``autoescape``: the term's ``%``, ``_`` and
    escape characters match themselves."""
    return or_(runs.c.id.startswith(text, autoescape=True),
               runs.c.agent_name == text,
               exists().where(run_labels.c.run_id == runs.c.id, run_labels.c.value == text),
               runs.c.error_message.icontains(text, autoescape=True))


def search_runs(conn: Connection, f: RunFilter, *, cursor: str | None, limit: int,
                oldest: bool = False) -> RunPage:
    """One page of the runs matching ``f`` (one query; two with a search
    term: the window's end, then the matches up to it)."""
    after = decode_cursor(cursor) if cursor is not None else None
    q, order = _ordered(f, after, limit + 1, oldest=oldest)
    edge = None
    if f.text is not None:
        edge = conn.execute(q.with_only_columns(*order, maintain_column_froms=True)
                            .limit(1).offset(SEARCH_WINDOW - 1)).first()
        q = q.where(_matches(f.text))
        if edge is not None:
            mark = tuple_(bindparam("edge_at", edge[0], type_=runs.c.created_at.type),
                          bindparam("edge_id", edge[1]))
            q = q.where(tuple_(*order) <= mark if oldest else tuple_(*order) >= mark)
    rows = [to_run(r) for r in conn.execute(q)]
    if len(rows) > limit:
        return RunPage(rows[:limit], encode_cursor(rows[limit - 1]))
    # Fewer matches than asked within the window: older runs remain past its end.
    return RunPage(rows, _cursor(edge[0], edge[1]) if edge is not None else None)


__all__ = ["MAX_SEARCH_CHARS", "SEARCH_WINDOW", "RunFilter", "RunPage", "decode_cursor",
           "encode_cursor", "search_runs"]
