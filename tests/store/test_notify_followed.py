"""An event notifies its run's channel only while a reader follows the run
(migration ``0023_notify_followed``): a notifying commit takes a lock for the
whole Postgres cluster through its WAL flush, so a lap commit of a run nobody
follows must send none. Postgres only (SQLite has no channel; its readers
poll)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from agent_worker.store import streamfeed
from agent_worker.store.sql import SqlStore
from agent_worker.store.streamfeed import PgEventWaiter, channel
from tests.store import runs as runs_helper

NOW = datetime(2026, 12, 5, 5, 0, tzinfo=UTC)


@pytest.fixture
def listener(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A bare connection that can LISTEN, registered as nobody's follower."""
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    conn = psycopg.connect(url, autocommit=True)
    yield conn
    conn.close()


def _listen(conn: psycopg.Connection[tuple[object, ...]], rid: str) -> None:
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(rid))))


def _heard(conn: psycopg.Connection[tuple[object, ...]], timeout: float = 1.0) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]


def _event(store: SqlStore, rid: str) -> int:
    store.record_event(rid, None, "probe", {}, now=NOW)
    return max(e.id for e in store.list_events(rid))


def _settled(waiter: PgEventWaiter) -> PgEventWaiter:
    """``waiter`` past its first wait, which may end early to settle its
    registration (see the last test) rather than for a hint."""
    waiter.wait(0.01)
    return waiter


def _followers(store: SqlStore, rid: str) -> int:
    with store.engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM event_followers WHERE run_id = :r"),
                             {"r": rid}).scalar_one())


def test_an_event_of_a_run_nobody_follows_notifies_nobody(
        pg_store: SqlStore, listener: psycopg.Connection[tuple[object, ...]]) -> None:
    rid = runs_helper.start(pg_store, NOW, prefix="quiet")
    _listen(listener, rid)
    _event(pg_store, rid)
    assert _heard(listener) == []


def test_an_event_of_a_followed_run_wakes_its_follower_and_every_listener(
        pg_store: SqlStore, listener: psycopg.Connection[tuple[object, ...]]) -> None:
    rid = runs_helper.start(pg_store, NOW, prefix="followed")
    other = runs_helper.start(pg_store, NOW, prefix="followed")
    _listen(listener, rid)
    waiter = _settled(PgEventWaiter(pg_store.engine, rid))
    try:
        assert _followers(pg_store, rid) == 1
        _event(pg_store, other)  # another run's event wakes nobody here
        assert not waiter.wait(0.3)
        event_id = _event(pg_store, rid)
        assert waiter.wait(5)
        assert _heard(listener) == [str(event_id)]
    finally:
        waiter.close()
    assert _followers(pg_store, rid) == 0  # closing unregistered it
    _event(pg_store, rid)
    assert _heard(listener) == []


def test_a_lapsed_registration_notifies_nobody_until_its_reader_waits_again(
        pg_store: SqlStore, listener: psycopg.Connection[tuple[object, ...]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that stopped waiting (a stalled consumer, a dead process that
    could not unregister) stops costing commits when its registration lapses;
    its next wait registers it again."""
    monkeypatch.setattr(streamfeed, "FOLLOW_SECONDS", 1)
    rid = runs_helper.start(pg_store, NOW, prefix="lapsed")
    _listen(listener, rid)
    waiter = _settled(PgEventWaiter(pg_store.engine, rid))
    try:
        time.sleep(1.2)  # past the registration's second, on the database's clock too
        _event(pg_store, rid)
        assert _heard(listener) == []
        waiter.wait(0.01)  # renews the registration (due after half of it)
        event_id = _event(pg_store, rid)
        assert _heard(listener) == [str(event_id)]
    finally:
        waiter.close()


def test_a_registration_clears_those_that_lapsed(pg_store: SqlStore) -> None:
    rid = runs_helper.start(pg_store, NOW, prefix="stale")
    with pg_store.engine.begin() as c:
        c.execute(text("INSERT INTO event_followers (follower, run_id, expires_at) "
                       "VALUES ('dead-reader', :r, timezone('UTC', now()) - interval '1 s')"),
                  {"r": rid})
    waiter = PgEventWaiter(pg_store.engine, rid)
    try:
        with pg_store.engine.connect() as c:
            left = c.execute(text("SELECT follower FROM event_followers WHERE run_id = :r"),
                             {"r": rid}).scalars().all()
        assert len(left) == 1 and left[0] != "dead-reader"
    finally:
        waiter.close()


def test_an_event_inserted_before_the_registration_and_committed_after_it_is_read(
        pg_store: SqlStore) -> None:
    """The registration's blind spot: a transaction inserted an event before
    the registration committed (its trigger saw no follower: no hint will
    come) and commits after the reader's read. The first wait after a
    registration lasts until the transactions running at it have ended, then
    says "read again", so the reader reads that event then, not at its poll."""
    rid = runs_helper.start(pg_store, NOW, prefix="blind")
    with pg_store.engine.connect() as writer:
        tx = writer.begin()
        writer.execute(text("INSERT INTO events (run_id, lap, kind, data, created_at) "
                            "VALUES (:r, 1, 'probe', NULL, now())"), {"r": rid})
        waiter = PgEventWaiter(pg_store.engine, rid)
        try:
            read = [e.kind for e in pg_store.list_events(rid)]  # the reader's read
            assert "probe" not in read
            threading.Timer(0.3, tx.commit).start()
            started = time.monotonic()
            assert waiter.wait(30)
            assert time.monotonic() - started < 5
            assert [e.kind for e in pg_store.list_events(rid)] == [*read, "probe"]
        finally:
            waiter.close()
