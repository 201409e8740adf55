"""Read-only aggregates for operators: the metrics exporter and the CLI's
progress view. Kept out of the ``Store`` protocol because the lap engine never
needs them; each function is one or two queries however many runs exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, and_, func, select

from agent_worker.vocabulary import RUNNABLE
from store.dbtime import read_now
from store.retry import with_retry
from store.rows import approvals, checkpoints, events, runs
from store.runstatus import shown_column, waiting_turn
from store.sql import SqlStore
from store.sweeping import live_versions

#: Reads here serve a scrape or an operator's screen: fail within seconds
#: rather than retry for the store's usual 30.
READ_DEADLINE_SECONDS = 5.0

T = TypeVar("T")


def _read(store: SqlStore, fn: Callable[[Connection], T]) -> T:
    def attempt() -> T:
        with store.engine.connect() as conn:
            return fn(conn)

    return with_retry(attempt, deadline_seconds=READ_DEADLINE_SECONDS)


@dataclass(frozen=True)
class AgentTotals:
    """Spend of every run of one agent, summed from the run rows."""

    runs: int = 0
    cost_micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    recoveries: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What the run and approval tables say right now."""

    runs_by_status: dict[str, int] = field(default_factory=dict)
    by_agent: dict[str, AgentTotals] = field(default_factory=dict)
    stale_runs: int = 0
    pending_approvals: int = 0
    oldest_pending_approval: datetime | None = None
    #: Queued runs per (agent, version) that no live worker serves.
    unserved: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class EventRow:
    """One audit event, as the incremental counters read it."""

    id: int
    kind: str
    data: dict[str, Any] | None
    created_at: datetime


def snapshot(store: SqlStore, *, stale_before: datetime) -> Snapshot:
    """Runs by status and agent, stale runs, pending approvals and runs of
    versions nobody serves (five queries).

    A run is stale when it should be moving (queued or running) but its last
    checkpoint is older than ``stale_before``; the definition matches
    ``AgentWorker.list_runs(stale=True)``.
    """

    def read(conn: Connection) -> Snapshot:
        stale = and_(runs.c.status.in_(RUNNABLE), runs.c.last_checkpoint_at < stale_before)
        status = shown_column().label("status")
        rows = conn.execute(
            select(
                runs.c.agent_name, status, func.count().label("n"),
                func.coalesce(func.sum(runs.c.cost_micros), 0).label("cost"),
                func.coalesce(func.sum(runs.c.input_tokens), 0).label("tin"),
                func.coalesce(func.sum(runs.c.output_tokens), 0).label("tout"),
                func.coalesce(func.sum(runs.c.recoveries), 0).label("rec"),
                func.count().filter(stale).label("stale"),
            ).group_by(runs.c.agent_name, status)
        ).all()
        by_status: dict[str, int] = {}
        by_agent: dict[str, AgentTotals] = {}
        stale_runs = 0
        for r in rows:
            by_status[r.status] = by_status.get(r.status, 0) + int(r.n)
            t = by_agent.get(r.agent_name, AgentTotals())
            by_agent[r.agent_name] = AgentTotals(
                runs=t.runs + int(r.n), cost_micros=t.cost_micros + int(r.cost),
                input_tokens=t.input_tokens + int(r.tin),
                output_tokens=t.output_tokens + int(r.tout),
                recoveries=t.recoveries + int(r.rec))
            stale_runs += int(r.stale)
        pending, oldest = conn.execute(
            select(func.count(), func.min(approvals.c.requested_at))
            .where(approvals.c.status == "pending")
        ).one()
        return Snapshot(runs_by_status=by_status, by_agent=by_agent, stale_runs=stale_runs,
                        pending_approvals=int(pending),
                        oldest_pending_approval=_aware(oldest), unserved=_unserved(conn))

    return _read(store, read)


def _unserved(conn: Connection) -> dict[tuple[str, str], int]:
    """Queued runs of versions whose queue no live worker consumes: the sweeper
    does not re-send them (it would only grow the queue) until one does."""
    live = live_versions(conn, read_now(conn, datetime.now(UTC)))
    rows = conn.execute(
        select(runs.c.agent_name, runs.c.agent_version, func.count().label("n"))
        .where(waiting_turn()).group_by(runs.c.agent_name, runs.c.agent_version))
    return {(r.agent_name, r.agent_version): int(r.n) for r in rows
            if (r.agent_name, r.agent_version) not in live}


def events_after(store: SqlStore, after_id: int, kinds: Sequence[str], *,
                 limit: int = 5000) -> list[EventRow]:
    """Events of ``kinds`` with an id above ``after_id``, oldest first.

    Walks the primary key, so an exporter that remembers how far it read pays
    only for new events.
    """
    q = (select(events.c.id, events.c.kind, events.c.data, events.c.created_at)
         .where(events.c.id > after_id, events.c.kind.in_(kinds))
         .order_by(events.c.id).limit(limit))
    rows = _read(store, lambda c: c.execute(q).all())
    return [EventRow(id=int(r.id), kind=r.kind, data=r.data, created_at=r.created_at)
            for r in rows]


def latest_checkpoints(store: SqlStore, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The newest checkpoint state of each run in ``run_ids`` (one query)."""
    if not run_ids:
        return {}
    newest = (select(checkpoints.c.run_id, func.max(checkpoints.c.lap).label("lap"))
              .where(checkpoints.c.run_id.in_(list(run_ids)))
              .group_by(checkpoints.c.run_id).subquery())
    q = select(checkpoints.c.run_id, checkpoints.c.state).join(
        newest, and_(checkpoints.c.run_id == newest.c.run_id,
                     checkpoints.c.lap == newest.c.lap))
    return {r.run_id: r.state for r in _read(store, lambda c: c.execute(q).all())}


def _aware(value: Any) -> datetime | None:
    """``min()`` bypasses the column's type decorator on some drivers."""
    if value is None:
        return None
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


__all__ = ["AgentTotals", "EventRow", "Snapshot", "events_after", "latest_checkpoints",
           "snapshot"]
