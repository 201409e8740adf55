"""Transaction helpers for the sweeper and the retention job.

The sweeper is what turns "a checkpoint" into "durable execution": it notices
dead workers (expired leases), lost messages (hand-offs nobody claimed), due
timers and timed-out approvals, and hands back the laps to send, only for
versions some live worker serves (``store.handoffs`` decides which hand-offs
are lost). Rows are picked with
``FOR UPDATE SKIP LOCKED`` so two sweepers never hand out the same run twice
(SQLite, single-process, ignores the clause).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)

from agent_worker.core.constants import SERVED_TTL_SECONDS
from agent_worker.core.vocabulary import PAUSED, TERMINAL, WaitingFor
from agent_worker.store.base import DueLap
from agent_worker.store.dbtime import read_now
from agent_worker.store.handoffs import resend_unclaimed
from agent_worker.store.pauses import wake
from agent_worker.store.queued import QueuedMessages
from agent_worker.store.rows import (
    approvals,
    checkpoints,
    effects,
    events,
    messages,
    runs,
    served_versions,
    signals,
)
from agent_worker.store.runstatus import in_flight


def _pick(conn: Connection, *cond: Any, limit: int) -> list[str]:
    q = select(runs.c.id).where(*cond).limit(limit).with_for_update(skip_locked=True)
    return list(conn.execute(q).scalars())


def _flip(conn: Connection, ids: list[str], now: datetime, kind: str,
          **extra: Any) -> list[DueLap]:
    if not ids:
        return []
    rows = conn.execute(
        update(runs).where(runs.c.id.in_(ids))
        .values(status="queued", lease_owner=None, lease_expires_at=None, wake_at=None,
                waiting_for=None, enqueued_at=now, updated_at=now, **extra)
        .returning(runs.c.id, runs.c.next_lap, runs.c.agent_name, runs.c.agent_version)
    ).all()
    conn.execute(insert(events), [
        {"run_id": r.id, "lap": r.next_lap, "kind": kind, "data": None, "created_at": now}
        for r in rows])
    return [DueLap(r.id, r.next_lap, r.agent_name, r.agent_version) for r in rows]


def _time_out_approvals(conn: Connection, now: datetime, limit: int) -> list[DueLap]:
    due: list[DueLap] = []
    rows = conn.execute(
        select(approvals).where(approvals.c.status == "pending", approvals.c.timeout_at <= now)
        .limit(limit).with_for_update(skip_locked=True)
    ).all()
    for a in rows:
        # Lock the run like every other decision does (store.wakeups); a run
        # another transaction holds right now is decided by a later sweep.
        if conn.execute(select(runs.c.id).where(runs.c.id == a.run_id)
                        .with_for_update(skip_locked=True)).first() is None:
            continue
        if a.on_timeout == "escalate" and a.escalate_to and a.owner != a.escalate_to:
            window = (a.timeout_at - a.requested_at) if a.timeout_at else timedelta(days=1)
            conn.execute(update(approvals).where(approvals.c.id == a.id)
                         .values(owner=a.escalate_to, timeout_at=now + window,
                                 on_timeout="reject"))
            conn.execute(insert(events).values(
                run_id=a.run_id, lap=None, kind="approval_escalated",
                data={"approval": a.id, "to": a.escalate_to}, created_at=now))
            continue
        status = "approved" if a.on_timeout == "approve" else "timed_out"
        conn.execute(update(approvals).where(approvals.c.id == a.id)
                     .values(status=status, decided_by="system:timeout", decided_at=now))
        conn.execute(insert(events).values(
            run_id=a.run_id, lap=None, kind="approval_timed_out",
            data={"approval": a.id, "status": status}, created_at=now))
        lap = wake(conn, a.run_id, now=now, waiting_for=WaitingFor.approval(a.id))
        if lap is not None:
            due.append(lap)
    return due


#: For the sweep's transaction on Postgres: plan every statement for its
#: values. The sweeper's connection sends the same statements every pass, so
#: psycopg prepares them, and Postgres then tried a generic plan, which cannot
#: see that ``status = 'running'`` is a sliver of the table: at a million runs
#: the expired-lease pick became a sequential scan, 250 ms a pass against 6 ms
#: planned for its values (BENCHMARKS.md, "Fewer bytes of WAL a lap").
CUSTOM_PLANS = text("SET LOCAL plan_cache_mode = force_custom_plan")


def sweep(conn: Connection, *, now: datetime, handoff_seconds: float,
          resend_max_seconds: float, limit: int,
          queued: QueuedMessages | None = None) -> list[DueLap]:
    if conn.dialect.name == "postgresql":
        conn.execute(CUSTOM_PLANS)
    # Every comparison below is on the database's clock (store.dbtime), read once.
    now = read_now(conn, now)
    live = live_versions(conn, now)
    lengths = queued.read(live) if queued is not None and live else {}
    expired = _pick(conn, in_flight(), runs.c.lease_expires_at < now, limit=limit)
    # A dead worker's lap keeps the slot it held (store.admitting): its re-send
    # is already admitted, so any process sends it, one that has not registered
    # the run's agent (and cannot know its caps) as well as one that has.
    due = _flip(conn, expired, now, "recovered", recoveries=runs.c.recoveries + 1,
                admitted_lap=runs.c.next_lap)
    timers = _pick(
        conn,
        runs.c.status.in_(PAUSED),
        runs.c.wake_at <= now,
        or_(runs.c.waiting_for.is_(None),
            ~runs.c.waiting_for.like(WaitingFor.prefix("approval") + "%")),
        limit=limit,
    )
    # A woken run asks admission for a slot like any other lap.
    due += _flip(conn, timers, now, "woken", admitted_lap=None)
    due += _time_out_approvals(conn, now, limit)
    due += resend_unclaimed(
        conn, now, live, handoff=timedelta(seconds=handoff_seconds),
        most=timedelta(seconds=resend_max_seconds), lengths=lengths,
        gone=timedelta(seconds=queued.gone_seconds if queued is not None else 0.0),
        limit=limit)
    # Never feed a queue nobody consumes (it would only grow); the hand-off
    # rule re-sends these laps once a worker of their version is alive.
    return [d for d in due if (d.agent_name, d.agent_version) in live]


def heartbeat(conn: Connection, worker: str, versions: Sequence[tuple[str, str]], *,
              now: datetime) -> None:
    """Replace ``worker``'s rows with fresh ones, on the database's clock; rows
    of workers silent for a day go too (they died without saying so)."""
    seen = read_now(conn, now)
    conn.execute(delete(served_versions).where(or_(
        served_versions.c.worker == worker, served_versions.c.seen_at < seen - timedelta(days=1))))
    if versions:
        conn.execute(insert(served_versions), [
            {"worker": worker, "agent_name": n, "agent_version": v, "seen_at": seen}
            for n, v in set(versions)])


def live_versions(conn: Connection, now: datetime) -> set[tuple[str, str]]:
    """The (agent, version) pairs some live worker serves, by its heartbeat."""
    rows = conn.execute(
        select(served_versions.c.agent_name, served_versions.c.agent_version).distinct()
        .where(served_versions.c.seen_at > now - timedelta(seconds=SERVED_TTL_SECONDS)))
    return {(r.agent_name, r.agent_version) for r in rows}


def prune_batch(conn: Connection, *, checkpoints_before: datetime, ledger_before: datetime,
                batch: int) -> dict[str, int]:
    """Delete one batch: intermediate checkpoints of finished runs (shallow runs
    at once, full ones after the retention age), then the ledger, audit log and
    messages of runs finished before the (much longer) ledger age. The run row
    and its final checkpoint stay."""
    finished = runs.c.status.in_(TERMINAL)
    old_ckpt = (
        select(checkpoints.c.run_id, checkpoints.c.lap)
        .join(runs, runs.c.id == checkpoints.c.run_id)
        .where(finished, checkpoints.c.lap < runs.c.next_lap - 1,
               or_(runs.c.retention == "shallow", runs.c.finished_at < checkpoints_before))
        .limit(batch)
    )
    keys = conn.execute(old_ckpt).all()
    counts = {"checkpoints": 0}
    if keys:
        counts["checkpoints"] = conn.execute(
            delete(checkpoints).where(tuple_(checkpoints.c.run_id, checkpoints.c.lap).in_(
                [tuple(k) for k in keys]))
        ).rowcount
    expired_runs = select(runs.c.id).where(and_(finished, runs.c.finished_at < ledger_before))
    for name, table in (("effects", effects), ("events", events), ("messages", messages),
                        ("signals", signals)):
        pk = list(table.primary_key.columns)
        ids = conn.execute(select(*pk).where(table.c.run_id.in_(expired_runs)).limit(batch)).all()
        counts[name] = 0
        if ids:
            counts[name] = conn.execute(
                delete(table).where(tuple_(*pk).in_([tuple(i) for i in ids]))).rowcount
    return counts
