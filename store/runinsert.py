"""Inserting a run: one helper that never commits, shared by
``SqlStore.create_run`` and a schedule's firing (``store.schedules``), which
creates its runs inside the transaction that claims the fire time."""

from __future__ import annotations

from sqlalchemy import Connection, insert, select

from agent_worker.store.base import NewRun, RunRecord
from agent_worker.store.dbtime import db_time
from agent_worker.store.rows import (
    checkpoints,
    message_body,
    messages,
    record_event_tx,
    runs,
    to_run,
)


def create_run_tx(conn: Connection, new: NewRun) -> tuple[RunRecord, bool]:
    """Insert a run with checkpoint 0 and its first messages, unless ``new.id``
    exists; never commits (``SqlStore.create_run`` and a schedule's firing
    each call it inside their own transaction)."""
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
            enqueued_at=db_time(new.now), labels=new.labels or None, priority=new.priority,
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
            "forked_from": new.parent_run_id,
            **({"traceparent": new.traceparent} if new.traceparent else {})}, new.now)
    row = conn.execute(select(runs).where(runs.c.id == new.id)).one()
    return to_run(row), True


__all__ = ["create_run_tx"]
