"""The live runs (queued and running) as the metrics scrape counts them, in one
grouping that every live figure of a scrape is summed from.

A scrape takes four things from run rows, all about live runs (every other
run is counted by ``store.rollup``'s totals): run counts and sums by agent
and status, the stale count, the fair-share lines (per tenant and agent:
slots held, runs queued, runs throttled and the oldest throttled wait;
``store.sharing.QueueLine``) and the unserved runs (per agent and version).
They were three statements, each reading every live row, and a live row
costs a heap page of its own once an update that cannot be HOT (a status
change, a renewed lease) has moved it (10,000 rows on 9,286 pages in the
seeded database of BENCHMARKS.md after ``bench.scale``'s renewals), so each
read cost about as much as the others: 11-30 ms at load 1-3. Grouped by
(tenant, agent, version, shown status) with every aggregate those figures
need, the rows are read once and the caller sums the groups the ways it
needs: exact, since every figure is a sum (or a minimum) over a disjoint
union of groups.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    String,
    bindparam,
    cast,
    func,
    literal,
    null,
    select,
)

from agent_worker.core.vocabulary import RUNNABLE
from agent_worker.store import admitting
from agent_worker.store.models import UTCDateTime
from agent_worker.store.rows import runs
from agent_worker.store.runstatus import shown_column, waiting_turn

#: The columns summed per (agent, status), after the run count.
SUMS = ("cost_micros", "input_tokens", "output_tokens", "recoveries")


@dataclass(frozen=True)
class LiveGroup:
    """The live runs of one tenant, agent, version and shown status."""

    tenant: str | None
    agent_name: str
    agent_version: str
    status: str
    runs: int
    cost_micros: int
    input_tokens: int
    output_tokens: int
    recoveries: int
    #: With no checkpoint since ``stale_before`` (``list_runs(stale=True)``).
    stale: int
    #: Holding a fair-share slot (``store.admitting.holds_slot``).
    holding: int
    #: Waiting for their turn: shown ``queued`` (``store.runstatus.waiting_turn``).
    waiting: int
    #: Waiting for a fair-share slot (no message sent yet).
    throttled: int
    oldest_throttled: datetime | None

    @classmethod
    def of(cls, row: Row[Any]) -> LiveGroup:
        """The group of a row of ``live_select`` (or of a part built with
        ``settled_columns``): its columns after ``live`` are the fields, in
        order; the counts and sums come as integers or (Postgres' ``sum`` of
        a ``bigint``) decimals."""
        values = dict(zip(_FIELDS, tuple(row)[1:], strict=True))
        for name in _COUNTED:
            values[name] = int(values[name] or 0)
        return cls(**values)


_FIELDS = tuple(f.name for f in fields(LiveGroup))
#: The counts and sums: every field between the key and the oldest wait.
_COUNTED = _FIELDS[4:-1]


#: The bound parameter of ``live_select(stale=True)``: runs with no checkpoint
#: since then are stale. A parameter, not a value, so a scrape executes one
#: statement built once per process (building it took 1.1 ms a scrape).
STALE_BEFORE = "stale_before"


def live_select(*, stale: bool = False) -> Select[Any]:
    """The live runs grouped into ``LiveGroup`` columns (plus ``live = 1``);
    with ``stale``, counting the stale ones takes the parameter
    ``STALE_BEFORE`` (else none is counted stale).

    One index range of ``status`` (both runnable statuses) and a heap visit
    per live row: nothing here reads a settled run."""
    shown = shown_column().label("status")  # a stored ``running`` between laps is ``queued``
    throttled = waiting_turn() & (runs.c.admitted_lap == admitting.THROTTLED)
    stale_count = (func.count().filter(runs.c.last_checkpoint_at < bindparam(STALE_BEFORE))
                   if stale else literal(0))
    return (select(literal(1).label("live"), runs.c.tenant, runs.c.agent_name,
                   runs.c.agent_version, shown, func.count().label("runs"),
                   *[func.coalesce(func.sum(runs.c[c]), 0).label(c) for c in SUMS],
                   stale_count.label("stale"),
                   func.count().filter(admitting.holds_slot()).label("holding"),
                   func.count().filter(waiting_turn()).label("waiting"),
                   func.count().filter(throttled).label("throttled"),
                   func.min(runs.c.enqueued_at, type_=UTCDateTime()).filter(throttled)
                   .label("oldest_throttled"))
            .where(runs.c.status.in_(RUNNABLE))
            .group_by(runs.c.tenant, runs.c.agent_name, runs.c.agent_version, shown))


def settled_columns(agent_name: ColumnElement[Any], status: ColumnElement[Any],
                    counts: list[ColumnElement[Any]]) -> list[ColumnElement[Any]]:
    """The columns of ``live_select`` for a part that counts settled runs by
    (agent, status) only (``counts``: the run count and ``SUMS``, labelled):
    ``live = 0``, no tenant or version, and none stale, holding or waiting, so
    it can be read in the same ``UNION ALL``, hence the same snapshot."""
    return [literal(0).label("live"), cast(null(), String).label("tenant"),
            agent_name.label("agent_name"), cast(null(), String).label("agent_version"),
            status.label("status"), *counts,
            *[literal(0).label(c) for c in ("stale", "holding", "waiting", "throttled")],
            cast(null(), UTCDateTime()).label("oldest_throttled")]


__all__ = ["STALE_BEFORE", "SUMS", "LiveGroup", "live_select", "settled_columns"]
