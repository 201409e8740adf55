"""The SQLAlchemy implementation of ``Store`` for Postgres (production) and
SQLite (in-process mode): the lap's side (``store.lapsql``) plus what the
public API and the CLI need (starting runs, queries, decisions, history).
Each public method owns exactly one transaction (``store.sqlbase``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select
from sqlalchemy.exc import IntegrityError

from agent_worker.vocabulary import RUNNABLE, RunStatus
from store import pauses
from store.base import (
    ApprovalRecord,
    DueLap,
    EffectRecord,
    EventRecord,
    NewRun,
    RunRecord,
    SignalRecord,
)
from store.dbtime import db_time
from store.lapsql import SqlLapStore
from store.rows import (
    checkpoints,
    events,
    message_body,
    messages,
    record_event_tx,
    runs,
    to_event,
    to_run,
)
from store.sharing import SqlShareStore


class SqlStore(SqlLapStore, SqlShareStore):
    """``Store`` over one SQLAlchemy engine; see ``SqlBase`` for how the lap's
    hot path saves round trips and fsyncs on Postgres."""

    def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        def tx(conn: Connection) -> tuple[RunRecord, bool]:
            existing = conn.execute(select(runs).where(runs.c.id == new.id)).first()
            if existing is not None:
                return to_run(existing), False
            conn.execute(
                insert(runs).values(
                    id=new.id, tenant=new.tenant, agent_name=new.agent_name,
                    agent_version=new.agent_version, status="queued", next_lap=new.start_lap + 1,
                    lap_attempts=0, input=new.input, limits=new.limits, laps_used=0,
                    input_tokens=0, output_tokens=0, cost_micros=0, retention=new.retention,
                    recoveries=0, parent_run_id=new.parent_run_id,
                    forked_from_lap=new.forked_from_lap, created_at=new.now,
                    updated_at=new.now, last_checkpoint_at=new.now,
                    enqueued_at=db_time(new.now), priority=new.priority,
                )
            )
            conn.execute(
                insert(checkpoints).values(
                    run_id=new.id, lap=new.start_lap, schema_version=new.schema_version,
                    state=new.checkpoint, created_at=new.now,
                )
            )
            if new.messages:
                conn.execute(
                    insert(messages),
                    [
                        {"run_id": new.id, "seq": i, "lap": new.start_lap,
                         "body": message_body(m),
                         "created_at": new.now}
                        for i, m in enumerate(new.messages)
                    ],
                )
            record_event_tx(conn, new.id, new.start_lap, "run_created",
                   {"agent": new.agent_name, "version": new.agent_version,
                    "forked_from": new.parent_run_id}, new.now)
            row = conn.execute(select(runs).where(runs.c.id == new.id)).one()
            return to_run(row), True

        try:
            return self._tx(tx)
        except IntegrityError:
            # Two callers raced with the same run id: the other one created it.
            run = self.get_run(new.id)
            if run is None:
                raise
            return run, False

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent: str | None = None,
        agent_version: str | None = None,
        tenant: str | None = None,
        stale_before: datetime | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        q = select(runs).order_by(runs.c.created_at.desc()).limit(limit)
        if status is not None:
            q = q.where(runs.c.status == status)
        if agent is not None:
            q = q.where(runs.c.agent_name == agent)
        if agent_version is not None:
            q = q.where(runs.c.agent_version == agent_version)
        if tenant is not None:
            q = q.where(runs.c.tenant == tenant)
        if stale_before is not None:
            q = q.where(
                runs.c.status.in_(RUNNABLE), runs.c.last_checkpoint_at < stale_before
            )
        return [to_run(r) for r in self._read(lambda c: c.execute(q).all())]

    def decide_approval(
        self, approval_id: str | None, run_id: str | None, *, approved: bool, by: str,
        comment: str | None, now: datetime,
    ) -> tuple[ApprovalRecord, DueLap | None]:
        return self._tx(lambda c: pauses.decide_approval(
            c, approval_id, run_id, approved=approved, by=by, comment=comment, now=now))

    def list_approvals(self, *, status: str = "pending", run_id: str | None = None,
                       limit: int = 100) -> list[ApprovalRecord]:
        return self._read(lambda c: pauses.list_approvals(c, status=status, run_id=run_id,
                                                          limit=limit))

    def send_signal(self, run_id: str, name: str, payload: Any, *, now: datetime,
                    max_pending: int | None = None) -> tuple[SignalRecord, DueLap | None]:
        return self._tx(lambda c: pauses.send_signal(c, run_id, name, payload, now=now,
                                                     max_pending=max_pending))

    def request_cancel(self, run_id: str, *, reason: str, by: str,
                       now: datetime) -> DueLap | None:
        return self._tx(lambda c: pauses.request_cancel(c, run_id, reason=reason, by=by, now=now))

    def requeue(self, run_id: str, *, now: datetime, from_statuses: Sequence[RunStatus],
                event: dict[str, Any], limits: dict[str, Any] | None = None,
                replay: bool = False) -> DueLap:
        return self._tx(lambda c: pauses.requeue(c, run_id, now=now, from_statuses=from_statuses,
                                                 event=event, limits=limits, replay=replay))

    def resolve_effect(self, key: str, *, applied: bool, result: Any, by: str,
                       now: datetime) -> EffectRecord:
        return self._tx(lambda c: pauses.resolve_effect(c, key, applied=applied, result=result,
                                                        by=by, now=now))

    def list_checkpoints(self, run_id: str) -> list[tuple[int, int, datetime]]:
        q = (select(checkpoints.c.lap, checkpoints.c.schema_version, checkpoints.c.created_at)
             .where(checkpoints.c.run_id == run_id).order_by(checkpoints.c.lap))
        return [(r.lap, r.schema_version, r.created_at) for r in self._read(lambda c: c.execute(q))]

    def get_checkpoint(self, run_id: str, lap: int) -> dict[str, Any] | None:
        q = select(checkpoints.c.state).where(checkpoints.c.run_id == run_id,
                                              checkpoints.c.lap == lap)
        state: dict[str, Any] | None = self._read(lambda c: c.execute(q).scalar())
        return state

    def list_events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]:
        q = select(events).where(events.c.run_id == run_id, events.c.id > after_id).order_by(
            events.c.id)
        return [to_event(r) for r in self._read(lambda c: c.execute(q).all())]


__all__ = ["SqlStore"]
