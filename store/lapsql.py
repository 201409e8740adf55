"""The lap's side of the SQL store: what ``LapStore`` promises a lap, the
sweeper and the retention task (claim, journal, effects, commit, release,
heartbeats, and the reads a lap makes)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Literal

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import IntegrityError

from agent_worker.core.errors import IdempotencyConflictError
from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import TERMINAL, EffectStatus, wait_text
from agent_worker.store import (
    audit,
    children,
    lapcommit,
    pauses,
    rollup,
    runstatus,
    statements,
    sweeping,
    wakeups,
)
from agent_worker.store import state as _state
from agent_worker.store.base import (
    ApprovalRecord,
    Claim,
    DueLap,
    EffectIntent,
    EffectRecord,
    LapCommit,
    RunRecord,
    RunUpdate,
    SignalRecord,
    StoredMessage,
)
from agent_worker.store.dbtime import db_time
from agent_worker.store.edits import StateEdit
from agent_worker.store.lapcache import Known, LapCache
from agent_worker.store.queued import QueuedMessages
from agent_worker.store.rows import (
    effects,
    fence,
    message_body,
    messages,
    record_event_tx,
    runs,
    served_versions,
    signals,
    to_effect,
    to_message,
    to_run,
)
from agent_worker.store.sqlbase import SqlBase


class SqlLapStore(SqlBase):
    """``LapStore`` over one SQLAlchemy engine (Postgres or SQLite)."""

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._read(lambda c: c.execute(select(runs).where(runs.c.id == run_id)).first())
        return None if row is None else to_run(row)

    @cached_property
    def lap_cache(self) -> LapCache:
        """What this process last committed per run (``store.lapcache``)."""
        return LapCache()

    def claim(
        self, run_id: str, lap: int, *, owner: str, now: datetime, lease_seconds: float,
        window_messages: int, served: Sequence[str] | None = None,
    ) -> Claim | None:
        params: dict[str, Any] = {"run_id": run_id, "lap": lap, "owner": owner, "now": now,
                                  "expires": now + timedelta(seconds=lease_seconds),
                                  "lease_seconds": lease_seconds,
                                  "any_version": served is None, "served": list(served or ())}
        known = self.lap_cache.offer(run_id, lap, window_messages)

        def tx(conn: Connection) -> Claim | None:
            row = conn.execute(statements.CLAIM if conn.dialect.name == "postgresql"
                               else statements.CLAIM_SQLITE, params).first()
            if row is None:
                return None
            run = to_run(row)
            state: dict[str, Any] = row.checkpoint_state
            edits = _state.pending_edits(conn, run_id) if row.has_edits else []
            if known is not None and _still(known, run, row.last_seq):
                # Nothing was written since this process's commit: no message
                # or ledger row of this lap exists yet, and the window is the one
                # that commit left.
                return Claim(run=run, lap=lap, owner=owner, checkpoint=state,
                             window=list(known.window), lap_messages=[], effects={},
                             state_edits=edits)
            return _load(conn, run, lap, owner, state, window_messages, edits)

        claim = self._autocommit(tx, durable=False)
        if claim is not None:
            self.lap_cache.claimed(run_id, Known(claim.run.created_at, lap, owner,
                                                 window_messages, claim.checkpoint,
                                                 tuple(claim.window)))
        return claim

    def renew_lease(
        self, run_id: str, lap: int, *, owner: str, now: datetime, lease_seconds: float
    ) -> Literal["ok", "lost", "cancelled"]:
        def tx(conn: Connection) -> Literal["ok", "lost", "cancelled"]:
            row = conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.next_lap == lap, runs.c.lease_owner == owner)
                .values(lease_expires_at=db_time(now + timedelta(seconds=lease_seconds),
                                                 lease_seconds))
                .returning(runs.c.cancel_requested_at)
            ).first()
            if row is None:
                return "lost"
            return "ok" if row.cancel_requested_at is None else "cancelled"

        return self._tx(tx)

    def journal_model_output(
        self, run_id: str, lap: int, *, owner: str, seq: int, message: Message, now: datetime
    ) -> Message:
        params = {"run_id": run_id, "seq": seq, "lap": lap, "owner": owner, "now": now,
                  "body": message_body(message)}

        def stored(conn: Connection) -> Message | None:
            fence(conn, run_id, lap, owner, now, cancel=True)
            existing = conn.execute(
                select(messages.c.body).where(messages.c.run_id == run_id, messages.c.seq == seq)
            ).scalar_one_or_none()
            return None if existing is None else Message.model_validate(existing)

        def tx(conn: Connection) -> Message | None:
            if conn.execute(statements.JOURNAL, params).first() is not None:
                return message
            return stored(conn)  # an earlier attempt's output: the lease is held

        try:
            journaled = self._autocommit(tx, durable=False)
        except IntegrityError as error:
            # Another attempt's output may have landed between the statement's
            # check and its insert (``statements.JOURNAL``): read it afresh.
            journaled = self._autocommit(stored, durable=False)
            if journaled is None:
                raise error
        assert journaled is not None, "fenced, and neither inserted nor stored"
        return journaled

    def begin_effect(
        self, intent: EffectIntent, *, owner: str, now: datetime, fence_cancel: bool = True
    ) -> tuple[EffectRecord, bool]:
        def tx(conn: Connection) -> tuple[EffectRecord, bool]:
            fence(conn, intent.run_id, None, owner, now, cancel=fence_cancel)
            key = {"effect_key": intent.key}
            existing = conn.execute(statements.EFFECT, key).first()
            if existing is None:
                created = conn.execute(statements.NEW_EFFECT, {
                    **intent.__dict__, "status": "pending", "result": None, "error": None,
                    "attempts": 1, "created_at": now, "updated_at": now}).one()
                return to_effect(created), True
            if existing.args_hash != intent.args_hash:
                raise IdempotencyConflictError(
                    f"effect {intent.key} was first called with different arguments "
                    f"(tool {existing.tool_name}); refusing to call it with new ones"
                )
            if existing.status in ("pending", "not_applied"):
                conn.execute(statements.EFFECT_AGAIN, {**key, "now": now})
            if existing.status == "not_applied":
                # Known never to have landed: the caller makes the call (again).
                return to_effect(conn.execute(statements.EFFECT, key).one()), True
            return to_effect(existing), False

        return self._tx(tx)

    def finish_effect(
        self, key: str, *, status: EffectStatus, result: Any, error: str | None,
        now: datetime,
    ) -> None:
        params: dict[str, Any] = {"effect_key": key, "now": now}
        if status == "compensated":
            self._tx(lambda conn: conn.execute(statements.EFFECT_COMPENSATED, params))
            return
        params.update(set_status=status, set_result=result, set_error=error)
        self._tx(lambda conn: conn.execute(statements.EFFECT_OUTCOME, params))

    def commit_lap(self, commit: LapCommit) -> bool:
        values = lapcommit.params(commit)

        def tx(conn: Connection) -> bool:
            if not lapcommit.write(conn, values):
                return False
            _commit_extras(conn, commit)
            _recheck_wait(conn, commit)
            return True

        # A commit that waits must re-check, in its transaction, for wake-ups
        # that arrived since the lap read them (``store.wakeups``); one that
        # ends the run must wake a parent waiting for it in the same
        # transaction (``store.children``); approvals, signals and edits land
        # with the lap. Any other commit is ``lapcommit.write``'s one statement
        # on Postgres, atomic alone: autocommit spares it BEGIN and COMMIT.
        alone = not (commit.new_approvals or commit.delivered_signals or commit.applied_edits
                     or commit.update.status == "waiting" or commit.update.status in TERMINAL)
        # A lap that only read and hands the run on skips the WAL flush
        # (``LapCommit.durable``): anything else it carried is durable.
        relaxed = alone and commit.update.enqueue and not commit.durable
        committed = self._autocommit(tx, durable=not relaxed) if alone else self._tx(tx)
        return self._remember(commit, values, committed)

    def _remember(self, commit: LapCommit, values: dict[str, Any], committed: bool) -> bool:
        """After the fenced commit: what the next lap starts from (its new
        messages as the commit stored them, ``values`` from
        ``lapcommit.params``), or nothing."""
        if committed and commit.update.status not in TERMINAL:
            self.lap_cache.committed(commit.run_id, commit.lap, commit.owner,
                                     commit.checkpoint,
                                     [(m["seq"], m["body"]) for m in values["messages"]])
        else:
            self.lap_cache.forget(commit.run_id)
        return committed

    def release(
        self, run_id: str, lap: int, *, owner: str, now: datetime, outcome: RunUpdate,
        event: dict[str, Any], reset_attempts: bool = False, fence_cancel: bool = True,
    ) -> bool:
        update_ = outcome

        def tx(conn: Connection) -> bool:
            values: dict[str, Any] = dict(
                status=runstatus.stored(update_.status), lease_owner=None, lease_expires_at=None,
                wake_at=update_.wake_at, waiting_for=wait_text(update_.waiting_for),
                error_code=update_.error_code, error_message=update_.error_message,
                error_detail=update_.error_detail, updated_at=now,
                enqueued_at=db_time(now) if update_.enqueue else None,
            )
            if update_.ending is not None:
                values["ending"] = update_.ending
            if update_.status in TERMINAL:
                values.update(finished_at=now, result=update_.result)
            if reset_attempts:
                values["lap_attempts"] = 0
            cond = [runs.c.id == run_id, runs.c.next_lap == lap, runs.c.lease_owner == owner]
            if fence_cancel:
                cond.append(runs.c.cancel_requested_at.is_(None))
            done = conn.execute(update(runs).where(*cond).values(**values))
            if done.rowcount != 1:
                return False
            record_event_tx(conn, run_id, lap, str(event.pop("kind", "released")), event, now)
            if update_.status in TERMINAL:
                _state.drop_pending(conn, run_id, lap, now)
                children.notify_parent(conn, run_id, now=now)
            return True

        return self._tx(tx)

    def sweep(self, *, now: datetime, handoff_seconds: float, resend_max_seconds: float,
              limit: int = 500, queued: QueuedMessages | None = None) -> list[DueLap]:
        return self._tx(lambda c: sweeping.sweep(
            c, now=now, handoff_seconds=handoff_seconds, resend_max_seconds=resend_max_seconds,
            limit=limit, queued=queued))

    def heartbeat(self, worker: str, versions: Sequence[tuple[str, str]], *,
                  now: datetime) -> None:
        self._tx(lambda c: sweeping.heartbeat(c, worker, versions, now=now))

    def forget_worker(self, worker: str) -> None:
        self._tx(lambda c: c.execute(
            delete(served_versions).where(served_versions.c.worker == worker)))

    def prune(self, *, checkpoints_before: datetime, ledger_before: datetime,
              batch: int) -> dict[str, int]:
        totals: dict[str, int] = {}
        while True:
            done = self._tx(lambda c: sweeping.prune_batch(
                c, checkpoints_before=checkpoints_before, ledger_before=ledger_before,
                batch=batch))
            done["audit_log"] = self._tx(lambda c: audit.prune_tx(c, before=ledger_before,
                                                                  batch=batch))
            for k, v in done.items():
                totals[k] = totals.get(k, 0) + v
            if not any(done.values()):
                # Keeps the run-total deltas short where no exporter folds them.
                while self._tx(rollup.fold) == rollup.FOLD_BATCH:
                    pass
                return totals

    def pending_signals(self, run_id: str, name: str) -> list[SignalRecord]:
        return self._read(lambda c: pauses.pending_signals(c, run_id, name))

    def approval_for(self, effect_key: str) -> ApprovalRecord | None:
        return self._read(lambda c: pauses.approval_for(c, effect_key))

    def list_messages(self, run_id: str, *, start: int = 0,
                      end: int | None = None) -> list[StoredMessage]:
        q = select(messages.c.seq, messages.c.lap, messages.c.body).where(
            messages.c.run_id == run_id, messages.c.seq >= start).order_by(messages.c.seq)
        if end is not None:
            q = q.where(messages.c.seq < end)
        return [to_message(r) for r in self._read(lambda c: c.execute(q).all())]

    def list_effects(self, run_id: str) -> list[EffectRecord]:
        q = select(effects).where(effects.c.run_id == run_id).order_by(
            effects.c.lap, effects.c.call_index, effects.c.created_at)
        return [to_effect(r) for r in self._read(lambda c: c.execute(q).all())]

    def record_event(self, run_id: str, lap: int | None, kind: str, data: dict[str, Any],
                     *, now: datetime) -> None:
        self._tx(lambda c: record_event_tx(c, run_id, lap, kind, data, now))


def _still(known: Known, run: RunRecord, last_seq: int | None) -> bool:
    """Whether the claimed run is still what this process committed
    (``store.lapcache``: the claim was fenced on ``known.lap``)."""
    count = int(known.state.get("message_count", 0))
    return run.created_at == known.created_at and (last_seq if last_seq is not None
                                                   else -1) == count - 1


def _load(conn: Connection, run: RunRecord, lap: int, owner: str, state: dict[str, Any],
          window_messages: int, edits: list[StateEdit]) -> Claim:
    """The claim from the database: the window, this lap's journaled messages
    and ledger rows; read by every lap that misses the lap cache (a run's next
    lap taken by another worker, a resume)."""
    count = int(state.get("message_count", 0))
    loaded = [to_message(m) for m in conn.execute(statements.WINDOW, {
        "run_id": run.id, "start": max(count - window_messages, 0),
        "summary": state.get("summary_seq")})]
    lap_messages = [m for m in loaded if m.seq >= count]
    # Tools run only after the lap's model output is journaled (or for
    # calls pending from an earlier lap, which keep that lap's keys), so
    # without either there is no ledger row to load.
    pending = state.get("pending_calls") or ()
    lap_effects: dict[str, EffectRecord] = {}
    if lap_messages or pending:
        laps = {lap} | {int(p["lap"]) for p in pending}
        lap_effects = {
            e.key: e
            for e in map(to_effect, conn.execute(select(effects).where(
                effects.c.run_id == run.id, effects.c.lap.in_(laps))))
        }
    window = [m for m in loaded if m.seq < count]
    return Claim(run=run, lap=lap, owner=owner, checkpoint=state, window=window,
                 lap_messages=lap_messages, effects=lap_effects, state_edits=edits)


def _commit_extras(conn: Connection, commit: LapCommit) -> None:
    """The rare parts of a lap commit: a new approval, consumed signals,
    applied state edits."""
    pauses.insert_approvals(conn, commit.new_approvals)
    _state.mark_applied(conn, commit.run_id, commit.lap, commit.applied_edits, commit.now)
    if commit.update.status in TERMINAL:
        _state.drop_pending(conn, commit.run_id, commit.lap, commit.now)
    if commit.delivered_signals:
        conn.execute(
            update(signals)
            .where(signals.c.id.in_(commit.delivered_signals), signals.c.delivered_lap.is_(None))
            .values(delivered_lap=commit.lap)
        )


def _recheck_wait(conn: Connection, commit: LapCommit) -> None:
    if commit.update.status in TERMINAL:
        children.notify_parent(conn, commit.run_id, now=commit.now)
    if commit.update.status == "waiting":
        wakeups.recheck(conn, commit.run_id, commit.lap, commit.update.waiting_for,
                        delivered=commit.delivered_signals, now=commit.now)


__all__ = ["SqlLapStore"]
