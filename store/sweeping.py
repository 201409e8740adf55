"""Transaction helpers for the sweeper and the retention job.

The sweeper is what turns "a checkpoint" into "durable execution": it notices
dead workers (expired leases), lost messages (queued too long), due timers and
timed-out approvals, and hands back the laps to send. Rows are picked with
``FOR UPDATE SKIP LOCKED`` so two sweepers never hand out the same run twice
(SQLite, single-process, ignores the clause).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, or_, select, tuple_, update

from store.base import TERMINAL, DueLap
from store.pauses import wake
from store.rows import approvals, checkpoints, effects, events, messages, runs, signals


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
        lap = wake(conn, a.run_id, now=now, waiting_for=f"approval:{a.id}")
        if lap is not None:
            due.append(lap)
    return due


def sweep(conn: Connection, *, now: datetime, overdue_before: datetime,
          limit: int) -> list[DueLap]:
    expired = _pick(conn, runs.c.status == "running", runs.c.lease_expires_at < now,
                    limit=limit)
    due = _flip(conn, expired, now, "recovered", recoveries=runs.c.recoveries + 1)
    timers = _pick(
        conn,
        runs.c.status.in_(("sleeping", "waiting")),
        runs.c.wake_at <= now,
        or_(runs.c.waiting_for.is_(None), ~runs.c.waiting_for.like("approval:%")),
        limit=limit,
    )
    due += _flip(conn, timers, now, "woken")
    due += _time_out_approvals(conn, now, limit)
    overdue = _pick(
        conn,
        runs.c.status == "queued",
        or_(runs.c.enqueued_at.is_(None), runs.c.enqueued_at < overdue_before),
        or_(runs.c.wake_at.is_(None), runs.c.wake_at <= now),
        limit=limit,
    )
    if overdue:
        rows = conn.execute(
            update(runs).where(runs.c.id.in_(overdue)).values(enqueued_at=now)
            .returning(runs.c.id, runs.c.next_lap, runs.c.agent_name, runs.c.agent_version)
        ).all()
        due += [DueLap(r.id, r.next_lap, r.agent_name, r.agent_version) for r in rows]
    return due


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
