"""``ActiveLaps``: at most ``limit`` threads between ``held`` and its end,
outside their ``waiting`` blocks. Proved with events and a barrier, never
with a wall-clock threshold."""

from __future__ import annotations

import threading
import time

import pytest

from agent_worker.engine.active_laps import ActiveLaps, _Places
from tests.unit.conftest import SizedWorker


def _try_hold(places: ActiveLaps, got: threading.Event, leave: threading.Event) -> None:
    with places.held():
        got.set()
        leave.wait(10)


def test_a_lap_past_the_limit_waits_until_a_place_is_free() -> None:
    places = ActiveLaps(2)
    got = [threading.Event() for _ in range(3)]
    leave = [threading.Event() for _ in range(3)]
    threads = [threading.Thread(target=_try_hold, args=(places, got[i], leave[i]))
               for i in range(3)]
    for t in threads[:2]:
        t.start()
    assert got[0].wait(10) and got[1].wait(10)
    threads[2].start()
    assert not got[2].wait(0.2)  # both places taken: the third waits...
    leave[0].set()
    assert got[2].wait(10)  # ...and gets the freed one
    for e in leave:
        e.set()
    for t in threads:
        t.join(10)


def test_waiting_gives_the_place_to_another_lap_and_takes_it_back() -> None:
    places = ActiveLaps(1)
    both_inside = threading.Barrier(2, timeout=10)
    back, release = threading.Event(), threading.Event()

    def first() -> None:
        with places.held():
            with places.waiting():
                both_inside.wait()  # only possible if the second got our place
            back.set()
            release.wait(10)

    def second() -> None:
        with places.held():
            both_inside.wait()

    a, b = threading.Thread(target=first), threading.Thread(target=second)
    a.start()
    b.start()
    b.join(10)
    assert back.wait(10) and not both_inside.broken
    got, leave = threading.Event(), threading.Event()
    third = threading.Thread(target=_try_hold, args=(places, got, leave))
    third.start()
    assert not got.wait(0.2)  # the first lap took its place back
    release.set()
    assert got.wait(10)
    leave.set()
    for t in (a, third):
        t.join(10)


def test_held_is_reentrant_and_waiting_outside_a_lap_is_a_no_op() -> None:
    places = ActiveLaps(1)
    finished = threading.Event()

    def lap() -> None:
        with places.waiting():  # a tool's own thread, a lap outside a worker
            pass
        with places.held(), places.held():  # a lap run inside a lap's thread
            pass
        finished.set()

    t = threading.Thread(target=lap, daemon=True)
    t.start()
    assert finished.wait(10), "a nested held() waited for the place its own thread holds"
    got, leave = threading.Event(), threading.Event()
    leave.set()
    other = threading.Thread(target=_try_hold, args=(places, got, leave))
    other.start()
    assert got.wait(10)  # the place was given back once, not kept
    other.join(10)


def test_no_limit_never_waits() -> None:
    places = ActiveLaps(0)
    inside = threading.Barrier(5, timeout=10)

    def lap() -> None:
        with places.held():
            inside.wait()

    threads = [threading.Thread(target=lap) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not inside.broken


def test_a_lap_that_raises_gives_its_place_back() -> None:
    places = ActiveLaps(1)
    with pytest.raises(RuntimeError), places.held():
        raise RuntimeError("lap failed")
    got = threading.Event()
    leave = threading.Event()
    leave.set()
    t = threading.Thread(target=_try_hold, args=(places, got, leave))
    t.start()
    assert got.wait(10)
    t.join(10)


def test_freed_places_go_to_the_waiters_in_the_order_they_came() -> None:
    places = _Places(1)
    places.acquire()
    order: list[int] = []

    def waiter(n: int) -> None:
        places.acquire()
        order.append(n)
        places.release()

    threads = []
    for n in range(5):
        t = threading.Thread(target=waiter, args=(n,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while len(places._waiters) < n + 1:  # this one is queued before the next starts
            assert time.monotonic() < deadline, "a waiter never queued"
            time.sleep(0.001)
    places.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("pool", "concurrency", "limit"), [
    ("threads", 275, 3),  # the setting, below
    ("prefork", 8, 0),  # a child runs one lap: nothing to take turns with
    ("solo", 1, 0),
])
def test_a_workers_runtime_limits_its_active_laps_by_its_pool(
        monkeypatch: pytest.MonkeyPatch, sized_worker: SizedWorker, pool: str,
        concurrency: int, limit: int) -> None:
    monkeypatch.setenv("AGENT_WORKER_WORKER_ACTIVE_LAPS", "3")
    assert sized_worker(pool, concurrency).get().active_laps.limit == limit
