"""What the lap's WAL savings must not cost (BENCHMARKS.md
"Fewer bytes of WAL a lap"), on Postgres, where they apply:

- the event trigger skips the run's row lock its transaction already holds
  (``0021_event_lock_once``), and a second writer of that run's events still
  waits for it, so events stay numbered in commit order;
- the journal no longer inserts with ``ON CONFLICT DO NOTHING``: an attempt
  whose output lands between its check and its insert is read, not lost, and
  the lap commit still stores the journaled output exactly once;
- ``0022_lap_columns_last`` moves the run row's lap columns to its end with
  every value kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import import_module
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, event, func, select, text

from agent_worker.core.errors import LeaseLost
from agent_worker.core.messages import Message
from agent_worker.store import lapcommit
from agent_worker.store.base import Claim, LapCommit, RunUpdate
from agent_worker.store.migrate import upgrade
from agent_worker.store.rows import message_body, messages
from agent_worker.store.sql import SqlStore
from tests.store import runs as runs_helper
from tests.support import wait_for

NOW = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)


def _start(store: SqlStore) -> str:
    return runs_helper.start(store, NOW, prefix="lean")


def _claim(store: SqlStore, rid: str) -> Claim:
    return runs_helper.claim(store, rid, 1, "w1", NOW)


def _event_sql(rid: str) -> Any:
    return text("INSERT INTO events (run_id, lap, kind, data, created_at) "
                "VALUES (:rid, 1, 'probe', NULL, now()) RETURNING id").bindparams(rid=rid)


def _blocks_someone(store: SqlStore, holder: Connection, what: str) -> None:
    """Wait until some backend waits for ``holder``'s transaction.

    Each poll is a transaction of its own: a transaction reads
    ``pg_stat_activity`` once and keeps what it read, so a poller that began
    before the waiter connected would never see it (the test timed out that
    way on a loaded machine)."""
    pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        wait_for(lambda: c.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE :h = ANY(pg_blocking_pids(pid))"),
            {"h": pid}).scalar(), timeout=10, interval=0.01, what=what)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)))
    thread.start()
    return thread, out


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # handed to the test thread, which asserts on it
        return e


def _second_writer(store: SqlStore, rid: str) -> tuple[threading.Thread, list[Any]]:
    """A transaction inserting an event of ``rid``, in a thread."""
    def write() -> int:
        with store.engine.connect() as conn:
            event_id = int(conn.execute(_event_sql(rid)).scalar_one())
            conn.commit()
            return event_id

    return _in_thread(write)


@pytest.mark.parametrize("first_updates_the_run", [True, False])
def test_events_of_one_run_are_numbered_in_commit_order(
        pg_store: SqlStore, first_updates_the_run: bool) -> None:
    rid = _start(pg_store)
    with pg_store.engine.connect() as first:
        tx = first.begin()
        if first_updates_the_run:  # as a lap commit does: the lock is held already
            first.execute(text("UPDATE runs SET updated_at = updated_at WHERE id = :r"), {"r": rid})
        first_id = int(first.execute(_event_sql(rid)).scalar_one())
        locker = first.execute(text("SELECT xmax FROM runs WHERE id = :r"), {"r": rid}).scalar()
        own = first.execute(text("SELECT pg_current_xact_id()::xid")).scalar()
        # The row version the UPDATE wrote is not locked again (no lock record
        # in the WAL); without the UPDATE the trigger locks it.
        assert (str(locker) == "0") is first_updates_the_run
        assert first_updates_the_run or str(locker) == str(own)
        thread, out = _second_writer(pg_store, rid)
        _blocks_someone(pg_store, first, "the second writer to wait for the first")
        tx.commit()
    thread.join(10)
    assert out and isinstance(out[0], int) and out[0] > first_id


def _race_journal(pg_store: SqlStore, rid: str, claim: Claim, theirs: Message) -> Message:
    """Journal our output while another attempt's insert of the same message
    number is in flight: ours waits on the primary key, then finds theirs."""
    seq = int(claim.checkpoint["message_count"])
    with pg_store.engine.connect() as other:
        tx = other.begin()
        other.execute(messages.insert().values(
            run_id=rid, seq=seq, lap=1, body=message_body(theirs), created_at=NOW))
        ours = Message(role="assistant", content="ours")
        thread, out = _in_thread(lambda: pg_store.journal_model_output(
            rid, 1, owner=claim.owner, seq=seq, message=ours, now=NOW))
        _blocks_someone(pg_store, other, "our journal to wait on the primary key")
        tx.commit()
    thread.join(10)
    assert out, "the journal did not return"
    if isinstance(out[0], Exception):
        raise out[0]
    found: Message = out[0]
    return found


def _count(conn: Connection, rid: str) -> int:
    return int(conn.execute(select(func.count()).select_from(messages)
                            .where(messages.c.run_id == rid)).scalar_one())


def test_a_journal_racing_another_attempts_output_returns_that_output(pg_store: SqlStore) -> None:
    rid = _start(pg_store)
    claim = _claim(pg_store, rid)
    theirs = Message(role="assistant", content="theirs")
    assert _race_journal(pg_store, rid, claim, theirs).content == "theirs"
    # The commit carries the journaled output again and stores it once.
    seq = int(claim.checkpoint["message_count"])
    assert pg_store.commit_lap(LapCommit(
        run_id=rid, lap=1, owner=claim.owner,
        messages=[(seq, theirs), (seq + 1, Message(role="user", content="result"))],
        checkpoint={**claim.checkpoint, "message_count": seq + 2}, schema_version=2,
        update=RunUpdate(status="queued", enqueue=True), usage=(1, 1, 1, 1), event={},
        now=NOW))
    with pg_store.engine.connect() as c:
        assert _count(c, rid) == 3
        bodies = c.execute(select(messages.c.body).where(messages.c.run_id == rid)
                           .order_by(messages.c.seq)).scalars().all()
    assert [b["content"] for b in bodies] == ["task", "theirs", "result"]


def _explained(conn: Connection, cursor: Any, statement: str, parameters: Any,
               context: Any, executemany: bool) -> tuple[str, Any]:
    return f"EXPLAIN {statement}", parameters


def test_the_lap_commit_looks_up_each_message_by_its_key(pg_store: SqlStore) -> None:
    """The lap commit's check for an already stored message stays a probe of
    ``pk_messages`` per message. As a plain NOT EXISTS, Postgres turns it
    into an anti-join, and for a small table (or one grown since its last
    ANALYZE) the plan a worker's connection caches hashed the whole table
    on every lap."""
    rid = _start(pg_store)
    claim = _claim(pg_store, rid)
    values = lapcommit.params(LapCommit(
        run_id=rid, lap=1, owner=claim.owner,
        messages=[(1, Message(role="assistant", content="a"))],
        checkpoint={**claim.checkpoint, "message_count": 2}, schema_version=2,
        update=RunUpdate(status="queued", enqueue=True), usage=(1, 1, 1, 1), event={},
        now=NOW))
    with pg_store.engine.connect() as c:
        # The statement as the store sends it, bound as it binds it, explained.
        event.listen(c, "before_cursor_execute", _explained, retval=True)
        shown = "\n".join(str(row[0]) for row in c.execute(lapcommit.ONE_STATEMENT, values))
    messages_part = shown[shown.index("Insert on messages"):shown.index("CTE new_checkpoint")]
    assert "Anti Join" not in messages_part and "Seq Scan on messages" not in messages_part
    assert "SubPlan" in messages_part and "using pk_messages on messages " in messages_part


def test_a_journal_that_loses_its_lease_meanwhile_is_fenced(pg_store: SqlStore) -> None:
    rid = _start(pg_store)
    claim = _claim(pg_store, rid)
    with pg_store.engine.begin() as c:  # another worker took the lap over
        c.execute(text("UPDATE runs SET lease_owner = 'w2' WHERE id = :r"), {"r": rid})
    with pytest.raises(LeaseLost):
        pg_store.journal_model_output(rid, 1, owner=claim.owner, seq=1,
                                message=Message(role="assistant", content="late"), now=NOW)
    with pg_store.engine.connect() as c:
        assert _count(c, rid) == 1


_OLD_ROW = ("INSERT INTO runs (id, tenant, agent_name, agent_version, status, next_lap, "
            "lap_attempts, lease_owner, lease_expires_at, enqueued_at, input, limits, "
            "laps_used, input_tokens, output_tokens, cost_micros, retention, recoveries, "
            "created_at, updated_at, last_checkpoint_at) VALUES (:id, 't', 'a', '1', :status, "
            ":lap, :attempts, :owner, :expires, :enqueued, '{\"doc\": \"x\"}', '{}', :lap, "
            ":tin, 7, 9, 'full', 0, :at, :at, :seen)")
_SEEN = ("id", "status", "next_lap", "lap_attempts", "lease_owner", "lease_expires_at",
         "enqueued_at", "laps_used", "input_tokens", "output_tokens", "cost_micros",
         "updated_at", "last_checkpoint_at", "input")


def _runs(url: str) -> tuple[list[tuple[Any, ...]], list[str], int]:
    engine = create_engine(url)
    with engine.connect() as c:
        c.execute(text("SELECT set_config('agent_worker.tenant', '*', false)"))
        rows = [tuple(r) for r in c.execute(text(
            f"SELECT {', '.join(_SEEN)} FROM runs ORDER BY id"))]
        order = list(c.execute(text(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'runs'::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")).scalars())
        totals = int(c.execute(text("SELECT count(*) FROM run_total_deltas")).scalar_one())
    engine.dispose()
    return rows, order, totals


def test_the_lap_columns_move_last_with_every_value(empty_db: str) -> None:
    """``0022_lap_columns_last`` on a database holding runs: every value kept
    (NULLs too), the lap's columns last in the migration's order, the
    metrics trigger it re-creates still firing."""
    upgrade(empty_db, "0021_event_lock_once")
    engine = create_engine(empty_db)
    at = datetime(2026, 12, 1, 8, 0)
    with engine.begin() as c:
        c.execute(text("SELECT set_config('agent_worker.tenant', '*', true)"))
        c.execute(text(_OLD_ROW), {"id": "r1", "status": "running", "lap": 4, "attempts": 2,
                                   "owner": "w:1", "expires": at, "enqueued": None,
                                   "tin": 2**40, "at": at, "seen": at})
        c.execute(text(_OLD_ROW), {"id": "r2", "status": "succeeded", "lap": 9, "attempts": 0,
                                   "owner": None, "expires": None, "enqueued": at,
                                   "tin": 5, "at": at, "seen": None})
    engine.dispose()
    before, _, totals_before = _runs(empty_db)
    upgrade(empty_db)
    after, order, totals_after = _runs(empty_db)
    assert after == before
    migration = import_module("agent_worker.store.migrations.versions.0022_lap_columns_last")
    assert order[-len(migration.LAP_COLUMNS):] == [c for c, _, _ in migration.LAP_COLUMNS]
    engine = create_engine(empty_db)
    with engine.begin() as c:  # the re-created trigger: a run settling adds deltas
        c.execute(text("SELECT set_config('agent_worker.tenant', '*', true)"))
        c.execute(text("UPDATE runs SET status = 'failed', cost_micros = 11 WHERE id = 'r1'"))
    engine.dispose()
    assert _runs(empty_db)[2] == totals_after + 1 and totals_after == totals_before
