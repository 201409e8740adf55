"""The lap commit: one description of how a lap leaves the run row, the
statements both dialects run, generated from it, and ``write``, the one
function that sends them (``SqlLapStore.commit_lap`` chooses only whether
it runs alone in autocommit or inside a transaction with the rare extras).

The fenced UPDATE of the run row (``ADVANCE``) and the inserts of the lap's
messages, checkpoint and audit event are written once, as SQLAlchemy Core over
the table definitions. Postgres runs them as a single statement of
data-modifying CTEs (one round trip, and in autocommit one fsync per
lap): every insert selects from the fenced UPDATE, so when the fence
fails (another worker owns the run, or it was cancelled) nothing at all is
written. SQLite, which has no data-modifying CTEs, runs the same UPDATE and
then the same inserts with the run id as a parameter, inside the caller's
transaction. Adding a column to the run row means adding it to ``_row`` and
``_SET`` here, nothing else.

The statements are built at import with bind parameters: building a SQLAlchemy
expression costs more than sending it, and these run on every lap.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    Boolean,
    Connection,
    Insert,
    Integer,
    Select,
    String,
    bindparam,
    case,
    column,
    func,
    insert,
    literal,
    null,
    select,
    true,
    update,
)
from sqlalchemy.dialects import sqlite

from agent_worker.core.vocabulary import TERMINAL, wait_text
from agent_worker.store.base import LapCommit
from agent_worker.store.dbtime import db_now
from agent_worker.store.models import UTCDateTime
from agent_worker.store.rows import checkpoints, events, message_body, messages, runs
from agent_worker.store.runstatus import stored

_lap = bindparam("lap", type_=Integer())
_now = bindparam("now", type_=UTCDateTime())

#: The run-row columns a lap commit sets from the commit's values (``_row``);
#: each is bound as ``set_<column>`` (a bind parameter may not share a name
#: with a column the UPDATE sets).
_SET = ("status", "wake_at", "waiting_for", "result", "error_code", "error_message",
        "error_detail", "laps_used", "input_tokens", "output_tokens", "cost_micros",
        "finished_at")

#: Take the run to its next lap, fenced on this lap, this lease and no cancel.
ADVANCE = (
    update(runs)
    .where(runs.c.id == bindparam("run_id", type_=String()), runs.c.next_lap == _lap,
           runs.c.lease_owner == bindparam("owner", type_=String()),
           runs.c.cancel_requested_at.is_(None))
    .values(
        **{name: bindparam(f"set_{name}", type_=runs.c[name].type) for name in _SET},
        next_lap=_lap + 1, lease_owner=null(), lease_expires_at=null(), lap_attempts=0,
        updated_at=_now, last_checkpoint_at=_now,
        # the hand-off starts on the database's clock (store.dbtime), not the worker's
        enqueued_at=case((bindparam("enqueue", type_=Boolean()), db_now(_now)), else_=null()),
        # a newer version that migrated the checkpoint moves the run's pin
        agent_version=func.coalesce(bindparam("set_agent_version", type_=String()),
                                    runs.c.agent_version),
    )
)


def _row(commit: LapCommit) -> dict[str, Any]:
    """The values of ``_SET`` for this commit: the one mapping from a lap's
    outcome to the run row."""
    u = commit.update
    laps, tin, tout, cost = commit.usage
    return {
        # a run handed to its next lap keeps the stored status (store.runstatus)
        "status": stored(u.status), "wake_at": u.wake_at, "waiting_for": wait_text(u.waiting_for),
        "result": u.result, "error_code": u.error_code, "error_message": u.error_message,
        "error_detail": u.error_detail, "laps_used": laps, "input_tokens": tin,
        "output_tokens": tout, "cost_micros": cost,
        "finished_at": commit.now if u.status in TERMINAL else None,
    }


def params(commit: LapCommit) -> dict[str, Any]:
    """Every bind parameter of the commit statements, on either dialect."""
    row = _row(commit)
    values: dict[str, Any] = {f"set_{name}": row[name] for name in _SET}
    values.update(
        run_id=commit.run_id, lap=commit.lap, owner=commit.owner, now=commit.now,
        enqueue=commit.update.enqueue, set_agent_version=commit.agent_version,
        schema_version=commit.schema_version, state=commit.checkpoint, event=commit.event,
        messages=[{"seq": seq, "body": message_body(m)} for seq, m in commit.messages],
    )
    return values


def _from(fenced: CTE | None, *columns: Any) -> Select[Any]:
    """``SELECT <run id>, columns``: from the fenced UPDATE on Postgres (no row
    when the fence failed), from the parameters on SQLite (already fenced)."""
    if fenced is None:
        return select(bindparam("run_id", type_=String()), *columns)
    return select(fenced.c.id, *columns).select_from(fenced)


def _checkpoint(fenced: CTE | None) -> Insert:
    return insert(checkpoints).from_select(
        ["run_id", "lap", "schema_version", "state", "created_at"],
        _from(fenced, _lap, bindparam("schema_version", type_=Integer()),
              bindparam("state", type_=checkpoints.c.state.type), _now))


def _event(fenced: CTE | None) -> Insert:
    return insert(events).from_select(
        ["run_id", "lap", "kind", "data", "created_at"],
        _from(fenced, _lap, literal("lap_committed"),
              bindparam("event", type_=events.c.data.type), _now))


def _one_statement() -> Select[Any]:
    """Postgres: the whole commit as one statement of data-modifying CTEs,
    returning how many run rows the fence let through (0 or 1)."""
    fenced = ADVANCE.returning(runs.c.id).cte("fenced")
    lap_messages = (
        func.json_to_recordset(bindparam("messages", type_=messages.c.body.type))
        .table_valued(column("seq", Integer()), column("body", messages.c.body.type))
        .render_derived(name="m", with_types=True)
    )
    # The journaled model output is among the lap's messages again (the lap
    # commit makes it durable); where it is stored already it is skipped. Not
    # by ON CONFLICT DO NOTHING: a speculative insertion logs a confirmation
    # record (48 bytes of WAL) for every row it inserts. The fence holds the
    # run row, so no other attempt of this lap inserts these numbers meanwhile.
    # OFFSET 0 keeps the check a probe of pk_messages per message: without it
    # Postgres turns NOT EXISTS into an anti-join, which it may plan as a hash
    # of the whole messages table (it did, in the generic plan a connection
    # caches, for a small table or one grown since its last ANALYZE).
    stored = select(messages.c.seq).where(messages.c.run_id == fenced.c.id,
                                          messages.c.seq == lap_messages.c.seq
                                          ).offset(0).exists()
    new_messages = insert(messages).from_select(
        ["run_id", "seq", "lap", "body", "created_at"],
        select(fenced.c.id, lap_messages.c.seq, _lap, lap_messages.c.body, _now)
        .select_from(fenced.join(lap_messages, true())).where(~stored))
    return (select(func.count()).select_from(fenced)
            .add_cte(new_messages.cte("new_messages"), _checkpoint(fenced).cte("new_checkpoint"),
                     _event(fenced).cte("new_event")))


ONE_STATEMENT = _one_statement()
_CHECKPOINT, _EVENT = _checkpoint(None), _event(None)
_MESSAGE = (sqlite.insert(messages).values(
    run_id=bindparam("run_id", type_=String()), seq=bindparam("seq", type_=Integer()), lap=_lap,
    body=bindparam("body", type_=messages.c.body.type), created_at=_now)
    .on_conflict_do_nothing())


def write(conn: Connection, values: dict[str, Any]) -> bool:
    """The fenced commit of one lap on ``conn`` (``values`` from ``params``);
    ``False``, with nothing written, when the fence failed. Never commits."""
    if conn.dialect.name == "postgresql":
        return int(conn.execute(ONE_STATEMENT, values).scalar_one()) == 1
    if conn.execute(ADVANCE, values).rowcount != 1:
        return False
    if values["messages"]:
        base = {k: values[k] for k in ("run_id", "lap", "now")}
        conn.execute(_MESSAGE, [{**base, **m} for m in values["messages"]])
    conn.execute(_CHECKPOINT, values)
    conn.execute(_EVENT, values)
    return True


__all__ = ["ADVANCE", "ONE_STATEMENT", "params", "write"]
