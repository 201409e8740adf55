"""Postgres-only fast path: a whole lap commit in one statement.

The fenced UPDATE of the run row and the inserts of the lap's messages, its
checkpoint and its audit event run as one statement of data-modifying CTEs, so
a lap commit costs one round trip instead of four. Every insert selects from
the fenced UPDATE, so when the fence fails (another worker owns the run, or it
was cancelled) nothing at all is written. SQLite takes the portable path in
``store.sql``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from agent_worker.vocabulary import TERMINAL, wait_text
from store.base import LapCommit
from store.rows import message_body

_COMMIT = text("""
WITH fenced AS (
    UPDATE runs SET
        next_lap = :lap + 1, status = :status, lease_owner = NULL, lease_expires_at = NULL,
        lap_attempts = 0, wake_at = :wake_at, waiting_for = :waiting_for,
        result = CAST(:result AS json), error_code = :error_code,
        error_message = :error_message, error_detail = :error_detail,
        laps_used = :laps, input_tokens = :tin, output_tokens = :tout, cost_micros = :cost,
        updated_at = :now, last_checkpoint_at = :now,
        -- the hand-off starts on the database's clock (store.dbtime), not the worker's
        enqueued_at = CASE WHEN :enqueue THEN timezone('UTC', now()) END,
        finished_at = :finished_at, agent_version = COALESCE(:agent_version, agent_version)
    WHERE id = :run_id AND next_lap = :lap AND lease_owner = :owner
      AND cancel_requested_at IS NULL
    RETURNING id
), new_messages AS (
    INSERT INTO messages (run_id, seq, lap, body, created_at)
    SELECT fenced.id, m.seq, :lap, m.body, :now
    FROM fenced, json_to_recordset(CAST(:messages AS json)) AS m(seq int, body json)
    ON CONFLICT (run_id, seq) DO NOTHING
), new_checkpoint AS (
    INSERT INTO checkpoints (run_id, lap, schema_version, state, created_at)
    SELECT fenced.id, :lap, :schema_version, CAST(:state AS json), :now FROM fenced
), new_event AS (
    INSERT INTO events (run_id, lap, kind, data, created_at)
    SELECT fenced.id, :lap, 'lap_committed', CAST(:event AS json), :now FROM fenced
)
SELECT count(*) FROM fenced
""")


def _naive_utc(value: datetime | None) -> datetime | None:
    """The columns hold naive UTC (see ``store.models.UTCDateTime``)."""
    return None if value is None else value.astimezone(UTC).replace(tzinfo=None)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def commit_lap(conn: Connection, commit: LapCommit) -> bool:
    """Fenced lap commit in one statement; ``False`` when the fence failed."""
    u = commit.update
    laps, tin, tout, cost = commit.usage
    now = _naive_utc(commit.now)
    params: dict[str, Any] = {
        "run_id": commit.run_id, "lap": commit.lap, "owner": commit.owner,
        "status": u.status, "wake_at": _naive_utc(u.wake_at),
        "waiting_for": wait_text(u.waiting_for),
        "result": _json(u.result), "error_code": u.error_code,
        "error_message": u.error_message, "error_detail": u.error_detail,
        "laps": laps, "tin": tin, "tout": tout, "cost": cost, "now": now,
        "enqueue": u.enqueue,
        "finished_at": now if u.status in TERMINAL else None,
        "messages": _json([{"seq": seq, "body": message_body(m)} for seq, m in commit.messages]),
        "schema_version": commit.schema_version, "state": _json(commit.checkpoint),
        "event": _json(commit.event), "agent_version": commit.agent_version,
    }
    return int(conn.execute(_COMMIT, params).scalar_one()) == 1
