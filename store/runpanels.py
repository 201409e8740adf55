"""What a run's page reads beside its window of laps (``store.runpages``):
for the timeline, the commit of the lap before the window and the events
that say why time passed between laps (a pause, a wake-up, a lease the
sweeper recovered, a retry, an admission after a wait for a slot); for the
decisions, the run's approvals, decided or not.

Kept out of the ``Store`` protocol like ``store.runpages``: the lap engine
never reads history this way. Callers check access first and read inside
``tenancy.scope``; on Postgres row-level security narrows these reads too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Connection, select

from agent_worker.store.base import ApprovalRecord, EventRecord
from agent_worker.store.retry import with_retry
from agent_worker.store.rows import approvals, events, to_approval, to_event
from agent_worker.store.sql import SqlStore

T = TypeVar("T")
#: Most approvals a run's page lists (a run asks for one per irreversible call).
APPROVALS_SHOWN = 100
#: The events that explain a gap between two laps; every other kind (a lap's
#: progress, a state edit) happens inside a lap or says nothing about waiting.
GAP_KINDS: tuple[str, ...] = (
    "admitted", "approval_decided", "approval_timed_out", "budget_pause", "budget_raised",
    "effect_resolved", "effect_unknown", "needs_attention", "recovered", "requeued", "retried",
    "retry", "signal_received", "woken")


@dataclass(frozen=True)
class GapEvents:
    """The commit of lap ``first - 1`` (``None`` when ``first`` is the first
    lap, or that commit was pruned) and, oldest first, the gap events of
    laps ``first..last + 1`` and of no lap, from that commit on."""

    before: EventRecord | None
    events: list[EventRecord]


def gap_events(store: SqlStore, run_id: str, *, first: int, last: int,
               until: datetime | None) -> GapEvents:
    """Read in one connection; see ``GapEvents``. ``until``: the last
    commit's time when a later lap exists (events after it belong to later
    pages), ``None`` to read up to now (the gap the run is in)."""

    def read(conn: Connection) -> GapEvents:
        before = conn.execute(select(events).where(
            events.c.run_id == run_id, events.c.kind == "lap_committed",
            events.c.lap == first - 1).order_by(events.c.id.desc()).limit(1)).first()
        q = select(events).where(
            events.c.run_id == run_id, events.c.kind.in_(GAP_KINDS),
            events.c.lap.is_(None) | events.c.lap.between(first, last + 1))
        if before is not None:
            q = q.where(events.c.id > before.id)
        if until is not None:
            q = q.where(events.c.created_at <= until)
        rows = conn.execute(q.order_by(events.c.id)).all()
        return GapEvents(None if before is None else to_event(before),
                         [to_event(r) for r in rows])

    return _read(store, read)


def run_approvals(store: SqlStore, run_id: str) -> list[ApprovalRecord]:
    """The run's approvals in every status, newest asked first."""
    q = (select(approvals).where(approvals.c.run_id == run_id)
         .order_by(approvals.c.requested_at.desc()).limit(APPROVALS_SHOWN))
    return _read(store, lambda c: [to_approval(r) for r in c.execute(q).all()])


def _read(store: SqlStore, fn: Callable[[Connection], T]) -> T:
    def attempt() -> T:
        with store.engine.connect() as conn:
            return fn(conn)

    return with_retry(attempt)


__all__ = ["APPROVALS_SHOWN", "GAP_KINDS", "GapEvents", "gap_events", "run_approvals"]
