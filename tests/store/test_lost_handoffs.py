"""The sweeper re-sends a hand-off only when the broker no longer holds its
message (``store.handoffs``): a queue that holds one message per waiting run
is a backlog, however long it waits; one that holds fewer lost that many, and
the oldest hand-offs are sent again. On both dialects, through ``Store.sweep``
with a queue reading the test sets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from agent_worker.store.base import RunUpdate
from agent_worker.store.queued import QueuedMessages, Version
from agent_worker.store.sql import SqlStore
from tests.store.test_conformance import _new, _uid, travel

__all__ = ["travel"]  # the fixture, used by name

GONE = 3.0
VERSION: Version = ("a", "1")


def _reading(lengths: dict[Version, int]) -> QueuedMessages:
    return QueuedMessages(read=lambda versions: {v: n for v, n in lengths.items()
                                                 if v in versions},
                          gone_seconds=GONE)


def _sweep(store: SqlStore, now: datetime, queued: QueuedMessages | None) -> list[str]:
    store.heartbeat("w1", [VERSION], now=now)
    return [d.run_id for d in store.sweep(now=now, handoff_seconds=10, resend_max_seconds=60,
                                          queued=queued)]


def _runs(store: SqlStore, n: int, travel: Callable[[float], datetime]) -> list[str]:
    """``n`` queued runs, sent one second apart (oldest first)."""
    ids = []
    for _ in range(n):
        rid = _uid("backlog")
        store.create_run(_new(rid, travel(1)))
        ids.append(rid)
    return ids


def test_a_backlog_its_queue_holds_is_never_sent_again(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    _runs(own_store, 5, travel)
    held = _reading({VERSION: 5})
    for _ in range(10):  # five minutes of sweeps, far past any hand-off timeout
        assert _sweep(own_store, travel(30), held) == []
    # Stale copies (runs claimed through another message) count as waiting too.
    assert _sweep(own_store, travel(30), _reading({VERSION: 9})) == []


def test_a_queue_that_lacks_messages_gets_that_many_the_oldest_first(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    ids = _runs(own_store, 5, travel)
    short, full = _reading({VERSION: 3}), _reading({VERSION: 5})
    # Counted missing, the two oldest hand-offs are suspected, not yet sent
    # (the newest, within ``gone_seconds`` of their send, not even that):
    # a worker may have taken their messages and not claimed yet.
    assert _sweep(own_store, travel(0.5), short) == []
    assert _sweep(own_store, travel(1), short) == []
    # Still missing ``gone_seconds`` later: sent again.
    assert sorted(_sweep(own_store, travel(GONE), short)) == sorted(ids[:2])
    # The queue holds them now: nothing more.
    assert _sweep(own_store, travel(GONE), full) == []
    # Lost once more: the same two, ``gone_seconds`` after their re-send.
    assert sorted(_sweep(own_store, travel(GONE), short)) == sorted(ids[:2])


def test_a_suspect_claimed_meanwhile_is_not_sent_again(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """The message a worker held while the queue was counted: by the next
    count its run is claimed, and nothing is sent."""
    taken, waiting = _runs(own_store, 2, travel)
    assert _sweep(own_store, travel(GONE + 1), _reading({VERSION: 1})) == []
    assert own_store.claim(taken, 1, owner="w", now=travel(0.1), lease_seconds=30,
                           window_messages=10)
    assert _sweep(own_store, travel(GONE), _reading({VERSION: 1})) == []
    assert waiting


def test_an_unread_queue_falls_back_to_the_age_of_the_hand_off(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    ids = _runs(own_store, 2, travel)
    unread = _reading({})
    assert _sweep(own_store, travel(5), unread) == []
    assert sorted(_sweep(own_store, travel(10), unread)) == sorted(ids)


def test_laps_the_pass_itself_sends_are_not_counted_as_lost(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """A run whose worker died is recovered and sent by the pass: its queue
    holds no message for it yet, and that must not make the pass send a
    waiting run's message again."""
    waiting = _runs(own_store, 1, travel)
    dead = _runs(own_store, 1, travel)[0]
    assert own_store.claim(dead, 1, owner="gone", now=travel(0), lease_seconds=5,
                           window_messages=10)
    assert _sweep(own_store, travel(20), _reading({VERSION: 1})) == [dead]
    assert waiting  # still queued, its message in the queue


def test_a_retry_whose_wait_is_over_is_sent_at_once(
        own_store: SqlStore, travel: Callable[[float], datetime]) -> None:
    """A lap released to retry later has no message until its wait is over:
    missing from its queue then, it is sent at the first count, not suspected."""
    rid = _runs(own_store, 1, travel)[0]
    now = travel(0)
    # The wait is stored as the lap computed it, on the clock the store compares
    # with: the caller's on SQLite, the database's on Postgres (store.dbtime).
    clock = now if own_store.engine.dialect.name == "sqlite" else own_store.current_time()
    assert own_store.claim(rid, 1, owner="w", now=now, lease_seconds=30, window_messages=10)
    assert own_store.release(rid, 1, owner="w", now=now, event={"kind": "retry"},
                             outcome=RunUpdate(status="queued",
                                               wake_at=clock + timedelta(seconds=1)))
    assert _sweep(own_store, travel(0.5), _reading({VERSION: 0})) == []  # still waiting
    assert _sweep(own_store, travel(GONE), _reading({VERSION: 0})) == [rid]
