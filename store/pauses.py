"""Transaction helpers for pauses: approvals, signals, cancellation and
requeues. None of them commits; ``SqlStore`` owns the transaction. A decision
flips the run row back to queued in the same transaction that records it, so
there is no moment where a decision exists and the run does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from agent_worker.core.errors import (
    AlreadyDecidedError,
    InvalidInputError,
    InvalidStateError,
    NotFoundError,
)
from agent_worker.core.vocabulary import TERMINAL, RunStatus, WaitingFor
from agent_worker.store import history
from agent_worker.store.base import ApprovalRecord, DueLap, EffectRecord, SignalRecord
from agent_worker.store.dbtime import db_time, read_now
from agent_worker.store.rows import (
    approvals,
    effects,
    record_event_tx,
    require_run,
    runs,
    signals,
    to_approval,
    to_effect,
    to_signal,
)


def insert_approvals(conn: Connection, new: Sequence[ApprovalRecord]) -> None:
    if new:
        conn.execute(insert(approvals), [a.__dict__ for a in new])


def wake(conn: Connection, run_id: str, *, now: datetime, waiting_for: WaitingFor | None = None,
         statuses: Sequence[RunStatus] = ("waiting",), extra: dict[str, Any] | None = None,
         ) -> DueLap | None:
    """Flip a paused run to queued (marked as sent now) if it is still paused
    the way the caller expects; return the lap to send."""
    cond = [runs.c.id == run_id, runs.c.status.in_(statuses)]
    if waiting_for is not None:
        cond.append(runs.c.waiting_for == waiting_for.format())
    row = conn.execute(
        update(runs).where(*cond)
        .values(status="queued", waiting_for=None, wake_at=None, enqueued_at=db_time(now),
                updated_at=now, lease_owner=None, lease_expires_at=None, **(extra or {}))
        .returning(runs.c.next_lap, runs.c.agent_name, runs.c.agent_version)
    ).first()
    if row is None:
        return None
    return DueLap(run_id, row.next_lap, row.agent_name, row.agent_version)


def _find_approval(conn: Connection, approval_id: str | None,
                   run_id: str | None) -> ApprovalRecord:
    if approval_id is not None:
        row = conn.execute(select(approvals).where(approvals.c.id == approval_id)).first()
        if row is None:
            raise NotFoundError(f"unknown approval {approval_id!r}")
        return to_approval(row)
    if run_id is None:
        raise InvalidInputError("name an approval id or a run id")
    require_run(conn, run_id)
    rows = conn.execute(
        select(approvals).where(approvals.c.run_id == run_id)
        .order_by(approvals.c.requested_at.desc())
    ).all()
    pending = [r for r in rows if r.status == "pending"]
    if len(pending) > 1:
        raise InvalidInputError(f"run {run_id} has {len(pending)} pending approvals; name one")
    if pending:
        return to_approval(pending[0])
    if rows:
        return to_approval(rows[0])
    raise InvalidStateError(f"run {run_id} has no approval to decide")


def find_approval(conn: Connection, approval_id: str | None,
                  run_id: str | None) -> ApprovalRecord:
    """The approval a decision names: by id, or the run's pending (else latest) one."""
    return _find_approval(conn, approval_id, run_id)


def decide_approval(
    conn: Connection, approval_id: str | None, run_id: str | None, *, approved: bool, by: str,
    comment: str | None, now: datetime,
    edit: Callable[[ApprovalRecord], dict[str, Any]] | None = None,
) -> tuple[ApprovalRecord, DueLap | None]:
    """Decide a pending approval. ``edit`` (approvals with edited arguments)
    maps the found approval to the arguments the call is to run with; it
    raises to refuse them, inside this transaction, so what it validated is
    the very approval decided."""
    found = _find_approval(conn, approval_id, run_id)
    require_run(conn, found.run_id, lock=True)  # see store.wakeups
    status = "approved" if approved else "rejected"
    edited = edit(found) if edit is not None and found.status == "pending" else None
    row = conn.execute(
        update(approvals)
        .where(approvals.c.id == found.id, approvals.c.status == "pending")
        .values(status=status, decided_by=by, comment=comment, decided_at=now,
                approved_arguments=edited)
        .returning(*approvals.c)
    ).first()
    if row is None:
        raise AlreadyDecidedError(
            f"approval {found.id} was already {found.status}"
            + (f" by {found.decided_by}" if found.decided_by else "")
        )
    data: dict[str, Any] = {"approval": found.id, "status": status, "by": by,
                            "comment": comment}
    if edited is not None:
        data["arguments"] = {"original": found.arguments, "approved": edited}
    record_event_tx(conn, found.run_id, None, "approval_decided", data, now)
    due = wake(conn, found.run_id, now=now, waiting_for=WaitingFor.approval(found.id))
    return to_approval(row), due


def list_approvals(conn: Connection, *, status: str, run_id: str | None,
                   limit: int, tenant: str | None = None) -> list[ApprovalRecord]:
    q = select(approvals).where(approvals.c.status == status).order_by(
        approvals.c.requested_at).limit(limit)
    if run_id is not None:
        q = q.where(approvals.c.run_id == run_id)
    if tenant is not None:
        q = q.where(approvals.c.run_id.in_(select(runs.c.id).where(runs.c.tenant == tenant)))
    return [to_approval(r) for r in conn.execute(q)]


def approval_for(conn: Connection, effect_key: str) -> ApprovalRecord | None:
    row = conn.execute(select(approvals).where(approvals.c.effect_key == effect_key)).first()
    return None if row is None else to_approval(row)


def send_signal(conn: Connection, run_id: str, name: str, payload: Any, *,
                now: datetime, max_pending: int | None = None
                ) -> tuple[SignalRecord, DueLap | None]:
    # Locked so a lap committing `waiting` at this moment sees this signal or
    # is seen by the wake below (store.wakeups).
    run = require_run(conn, run_id, lock=True)
    if run.status in TERMINAL:
        raise InvalidStateError(f"run {run_id} is {run.status}; it takes no more signals")
    if max_pending is not None:
        _check_pending(conn, run_id, max_pending)
    row = conn.execute(
        insert(signals).values(run_id=run_id, name=name, payload=payload, created_at=now)
        .returning(*signals.c)
    ).one()
    record_event_tx(conn, run_id, None, "signal_received", {"name": name, "id": row.id}, now)
    return to_signal(row), wake(conn, run_id, now=now, waiting_for=WaitingFor.signal(name))


def _check_pending(conn: Connection, run_id: str, limit: int) -> None:
    """Refuse a signal past ``limit`` undelivered ones: a sender in a loop must
    not grow a run without bound. The run row is locked first (a no-op update),
    so two senders racing for the last slot cannot both pass the count."""
    conn.execute(update(runs).where(runs.c.id == run_id).values(id=runs.c.id))
    waiting = conn.execute(select(func.count()).select_from(signals).where(
        signals.c.run_id == run_id, signals.c.delivered_lap.is_(None))).scalar_one()
    if waiting >= limit:
        raise InvalidStateError(
            f"run {run_id} already holds {waiting} undelivered signals (limit {limit})")


def pending_signals(conn: Connection, run_id: str, name: str) -> list[SignalRecord]:
    q = select(signals).where(signals.c.run_id == run_id, signals.c.name == name,
                              signals.c.delivered_lap.is_(None)).order_by(signals.c.id)
    return [to_signal(r) for r in conn.execute(q)]


def request_cancel(conn: Connection, run_id: str, *, reason: str, by: str,
                   now: datetime) -> DueLap | None:
    run = require_run(conn, run_id)
    if run.status in TERMINAL:
        raise InvalidStateError(f"run {run_id} is already {run.status}")
    if run.cancel_requested_at is not None:
        return None
    conn.execute(
        update(runs).where(runs.c.id == run_id)
        # The ending gets fresh attempts: inheriting those of a lap that was
        # failing would end the run "failed" without running compensations.
        .values(cancel_requested_at=now, cancel_reason=reason, cancelled_by=by,
                ending="cancelled", updated_at=now, lap_attempts=0)
    )
    conn.execute(
        update(approvals).where(approvals.c.run_id == run_id, approvals.c.status == "pending")
        .values(status="cancelled", decided_by=by, comment=reason, decided_at=now)
    )
    record_event_tx(conn, run_id, None, "cancel_requested", {"by": by, "reason": reason}, now)
    # A lap in flight cannot commit any more (its fence checks the cancel); it
    # hands the run back itself. Anything not leased is woken to compensate.
    live_lease = run.lease_owner is not None and (
        run.lease_expires_at is not None and run.lease_expires_at > read_now(conn, now))
    if live_lease:
        return None
    return wake(conn, run_id, now=now, statuses=("queued", "waiting", "sleeping", "running"))


def requeue(conn: Connection, run_id: str, *, now: datetime, from_statuses: Sequence[RunStatus],
            event: dict[str, Any], limits: dict[str, Any] | None = None,
            replay: bool = False) -> DueLap:
    """Queue a failed or waiting run again; with ``replay`` (a retry, which
    resumes history) only if that history still stands (``store.history``)."""
    run = require_run(conn, run_id, lock=replay)
    if replay:
        history.require_replayable(conn, run_id)
    if run.status not in from_statuses:
        raise InvalidStateError(
            f"run {run_id} is {run.status}; expected one of {', '.join(from_statuses)}")
    extra: dict[str, Any] = {"lap_attempts": 0, "error_code": None, "error_message": None,
                             "error_detail": None, "finished_at": None}
    if run.status == "failed":
        extra["ending"] = None
    if limits is not None:
        extra["limits"] = limits
    due = wake(conn, run_id, now=now, statuses=from_statuses, extra=extra)
    if due is None:
        raise InvalidStateError(f"run {run_id} changed while being requeued; try again")
    record_event_tx(conn, run_id, None, str(event.pop("kind", "requeued")), event, now)
    return due


def resolve_effect(conn: Connection, key: str, *, applied: bool, result: Any, by: str,
                   now: datetime) -> EffectRecord:
    """Record a human's verdict on an ``unknown`` effect of a run that waits on
    it. Anything else is refused: a pending effect may still be in flight (a
    verdict could make a replay repeat a call that is landing right now), and
    the row is never deleted (the verdict, who and when stay on it)."""
    row = conn.execute(select(effects).where(effects.c.key == key)).first()
    if row is None:
        raise NotFoundError(f"unknown effect {key!r}")
    run = require_run(conn, row.run_id, lock=True)
    if row.status != "unknown":
        raise AlreadyDecidedError(
            f"effect {key} is {row.status}; only an effect whose outcome is unknown (and "
            "that its run waits on) can be resolved")
    live_lease = run.lease_owner is not None and (
        run.lease_expires_at is not None and run.lease_expires_at > now)
    if run.status != "waiting" or run.waiting_for != WaitingFor.effect(key).format() or live_lease:
        raise InvalidStateError(
            f"run {run.id} is {run.status}"
            + (f" waiting for {run.waiting_for}" if run.waiting_for else "")
            + f", not waiting on effect {key}; resolve it when the run waits on it")
    verdict = "applied" if applied else "not_applied"
    stamp = f"resolved as {verdict.replace('_', ' ')} by {by} at {now:%Y-%m-%d %H:%M:%S} UTC"
    conn.execute(update(effects).where(effects.c.key == key)
                 .values(status=verdict, result=result if applied else None, updated_at=now,
                         error=stamp))
    record_event_tx(conn, row.run_id, row.lap, "effect_resolved",
                    {"key": key, "applied": applied, "by": by}, now)
    wake(conn, row.run_id, now=now, waiting_for=WaitingFor.effect(key), extra={"lap_attempts": 0})
    resolved = conn.execute(select(effects).where(effects.c.key == key)).one()
    return to_effect(resolved)
