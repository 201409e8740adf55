"""What the lap's WAL savings must not cost (issue 21 goal 1, BENCHMARKS.md
"Fewer bytes of WAL a lap"), on Postgres, where they apply:

- the event trigger skips the run's row lock its transaction already holds
  (``0021_event_lock_once``), and a second writer of that run's events still
  waits for it, so events stay numbered in commit order;
- the journal no longer inserts with ``ON CONFLICT DO NOTHING``: an attempt
  whose output lands between its check and its insert is read, not lost, and
  the lap commit still stores the journaled output exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, func, select, text

from agent_worker.errors import LeaseLost
from agent_worker.messages import Message
from store.base import Claim, LapCommit, RunUpdate
from store.rows import message_body, messages
from store.sql import SqlStore
from tests.store import runs as runs_helper

NOW = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)


def _start(store: SqlStore) -> str:
    return runs_helper.start(store, NOW, prefix="lean")


def _claim(store: SqlStore, rid: str) -> Claim:
    return runs_helper.claim(store, rid, 1, "w1", NOW)


def _event_sql(rid: str) -> Any:
    return text("INSERT INTO events (run_id, lap, kind, data, created_at) "
                "VALUES (:rid, 1, 'probe', NULL, now()) RETURNING id").bindparams(rid=rid)


def _waits_for_lock(store: SqlStore, pid: int) -> bool:
    with store.engine.connect() as c:
        for _ in range(500):
            kind = c.execute(text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                             {"p": pid}).scalar()
            if kind == "Lock":
                return True
            c.execute(text("SELECT pg_sleep(0.01)"))
    return False


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


def _second_writer(store: SqlStore, rid: str) -> tuple[threading.Thread, list[Any], int]:
    """A transaction inserting an event of ``rid`` in a thread; its backend pid."""
    conn = store.engine.connect()
    pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    conn.commit()

    def write() -> int:
        with conn:
            event_id = int(conn.execute(_event_sql(rid)).scalar_one())
            conn.commit()
            return event_id

    thread, out = _in_thread(write)
    return thread, out, pid


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
        thread, out, pid = _second_writer(pg_store, rid)
        assert _waits_for_lock(pg_store, pid), "the second writer drew its id without waiting"
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
        pid = int(other.execute(text("SELECT pg_backend_pid()")).scalar_one())
        ours = Message(role="assistant", content="ours")
        thread, out = _in_thread(lambda: pg_store.journal_model_output(
            rid, 1, owner=claim.owner, seq=seq, message=ours, now=NOW))
        assert _waiting_on_index(pg_store, pid), "our journal never reached the insert"
        tx.commit()
    thread.join(10)
    assert out, "the journal did not return"
    if isinstance(out[0], Exception):
        raise out[0]
    found: Message = out[0]
    return found


def _waiting_on_index(pg_store: SqlStore, holder: int) -> bool:
    """Whether some backend waits for ``holder``'s transaction."""
    with pg_store.engine.connect() as c:
        for _ in range(500):
            if c.execute(text("SELECT count(*) FROM pg_stat_activity "
                              "WHERE :h = ANY(pg_blocking_pids(pid))"), {"h": holder}).scalar():
                return True
            c.execute(text("SELECT pg_sleep(0.01)"))
    return False


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

