"""Aggregates for operators: the metrics exporter and the CLI's progress view
(read-only, but for folding the totals of ``store.rollup``). Kept out of the
``Store`` protocol because the lap engine never needs them; each function is
one or two queries however many runs exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, and_, func, select, text

from agent_worker.core.errors import RetriableStoreError
from agent_worker.store import rollup
from agent_worker.store.census import LiveGroup
from agent_worker.store.dbtime import read_now
from agent_worker.store.retry import with_retry
from agent_worker.store.rows import checkpoints, events
from agent_worker.store.sharing import QueueLine, lines_of
from agent_worker.store.sql import SqlStore
from agent_worker.store.sweeping import live_versions

log = logging.getLogger(__name__)

#: Reads here serve a scrape or an operator's screen: fail within seconds
#: rather than retry for the store's usual 30.
READ_DEADLINE_SECONDS = 5.0

T = TypeVar("T")


def _read(store: SqlStore, fn: Callable[[Connection], T]) -> T:
    def attempt() -> T:
        # JIT is off for every session of ours (store.db): it took 80 ms of
        # a 90 ms approval count at a million runs here.
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
    #: The fair-share lines (``ShareStore.queue_lines``), from the same read.
    queue_lines: list[QueueLine] = field(default_factory=list)


@dataclass(frozen=True)
class EventRow:
    """One audit event, as the incremental counters read it."""

    id: int
    kind: str
    data: dict[str, Any] | None
    created_at: datetime


def snapshot(store: SqlStore, *, stale_before: datetime, fold: bool = True) -> Snapshot:
    """Runs by status and agent, stale runs, pending approvals, runs of
    versions nobody serves and the fair-share lines (three queries and the
    database's time), none of which reads a run row but the live (queued,
    running) ones, each once, nor an approval row but the oldest pending:
    settled runs and the pending count come from ``store.rollup``'s totals,
    exact as of the query's snapshot.

    With ``fold`` (the exporter's scrape), first folds the deltas appended
    since the last fold, so the next read stays short; a fold that fails is
    logged and the read goes on (it is exact without it).

    A run is stale when it should be moving (queued or running) but its last
    checkpoint is older than ``stale_before``; the definition matches
    ``AgentWorker.list_runs(stale=True)``.
    """
    if fold:
        try:
            refresh(store)
        except RetriableStoreError:
            # The database is unreachable: the read would wait out the same
            # deadline again, and a scrape must answer "store down" promptly.
            raise
        except Exception as e:  # the read below does not depend on it
            log.warning("could not fold the rollups: %s", e)

    def read(conn: Connection) -> Snapshot:
        figures = rollup.read_figures(conn, stale_before=stale_before)
        by_status: dict[str, int] = {}
        by_agent: dict[str, AgentTotals] = {}
        for r in figures.totals:
            by_status[r.status] = by_status.get(r.status, 0) + r.runs
            t = by_agent.get(r.agent_name, AgentTotals())
            by_agent[r.agent_name] = AgentTotals(
                runs=t.runs + r.runs, cost_micros=t.cost_micros + r.cost_micros,
                input_tokens=t.input_tokens + r.input_tokens,
                output_tokens=t.output_tokens + r.output_tokens,
                recoveries=t.recoveries + r.recoveries)
        pending, oldest = conn.execute(rollup.pending_query()).one()
        at = read_now(conn, datetime.now(UTC))
        return Snapshot(runs_by_status=by_status, by_agent=by_agent,
                        stale_runs=sum(r.stale for r in figures.totals),
                        pending_approvals=int(pending),
                        oldest_pending_approval=_aware(oldest),
                        unserved=_unserved(conn, figures.live, at),
                        queue_lines=lines_of(figures.live, at=at))

    return _read(store, read)


def refresh(store: SqlStore, *, max_batches: int = 10) -> int:
    """Fold the pending deltas of every rollup (runs and approvals), a batch
    per transaction, until none is left, another folder holds the lock, or
    ``max_batches`` (a scrape must stay short; the rest waits for the next).
    Returns how many were folded."""
    done = 0
    for _ in range(max_batches):  # each folds up to FOLD_BATCH of every rollup
        def attempt() -> int:
            with store.engine.begin() as conn:
                return rollup.fold(conn)

        moved = with_retry(attempt, deadline_seconds=READ_DEADLINE_SECONDS)
        done += moved
        if moved < rollup.FOLD_BATCH:
            break
    return done


def _unserved(conn: Connection, live: list[LiveGroup], at: datetime
              ) -> dict[tuple[str, str], int]:
    """Queued runs of versions whose queue no live worker consumes: the sweeper
    does not re-send them (it would only grow the queue) until one does."""
    served = live_versions(conn, at)
    out: dict[tuple[str, str], int] = {}
    for g in live:
        key = (g.agent_name, g.agent_version)
        if g.waiting and key not in served:
            out[key] = out.get(key, 0) + g.waiting
    return out


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


def events_before(store: SqlStore, before_id: int | None, kinds: Sequence[str], *,
                  limit: int = 5000) -> list[EventRow]:
    """Events of ``kinds`` with an id below ``before_id`` (``None``: the newest),
    newest first: the exporter walks back from the log's end when it starts."""
    q = select(events.c.id, events.c.kind, events.c.data, events.c.created_at).where(
        events.c.kind.in_(kinds))
    if before_id is not None:
        q = q.where(events.c.id < before_id)
    rows = _read(store, lambda c: c.execute(q.order_by(events.c.id.desc()).limit(limit)).all())
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


#: The oldest open transaction of another client session in this database.
#: ``pg_stat_activity`` shows ``xact_start`` only for sessions of the reader's
#: own role (and its members') unless it holds ``pg_read_all_stats``; the wall
#: clock, not ``now()``, which a test database may shift.
_OLDEST_TRANSACTION = text(
    "SELECT coalesce(max(extract(epoch FROM pg_catalog.clock_timestamp() - xact_start)), 0) "
    "FROM pg_catalog.pg_stat_activity WHERE datname = pg_catalog.current_database() "
    "AND backend_type = 'client backend' AND xact_start IS NOT NULL "
    "AND pid <> pg_catalog.pg_backend_pid()")


def oldest_transaction_seconds(store: SqlStore) -> float | None:
    """How long the oldest transaction open in the store's database has been
    open (0: none), ``None`` on SQLite. While one stays open no row version
    that died since it began can be removed, by vacuum or page pruning: every
    lap updates its run row, so ``runs`` and ``effects`` grow with the laps
    committed meanwhile (BENCHMARKS.md, "Database-side faults")."""
    if store.engine.dialect.name != "postgresql":
        return None
    return float(_read(store, lambda c: c.execute(_OLDEST_TRANSACTION).scalar_one()))


def _aware(value: Any) -> datetime | None:
    """``min()`` bypasses the column's type decorator on some drivers."""
    if value is None:
        return None
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


__all__ = ["AgentTotals", "EventRow", "Snapshot", "events_after", "events_before",
           "latest_checkpoints", "oldest_transaction_seconds",
           "refresh", "snapshot"]
