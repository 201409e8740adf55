"""How many of a process's laps do their own work at once.

A ``threads`` worker holds hundreds of laps, nearly all of them waiting on
their model. When a wave of model answers comes back together (runs started
together, answered after about the same latency), every answering lap wants
the interpreter's lock, Postgres and Redis at the same moment, and they take
turns at every socket call: each lap of the wave ends near the end of the
wave, so the next wave comes back bunched again, and the switching between
them (futexes, the scheduler, Postgres backends woken for one statement
each) costs CPU of its own. With only a few laps past this gate at once, a
wave is served nearly in the order it came back, its laps finish spread out,
and fewer threads contend. Measured with two workers on 2 cores, 400 runs
and 1 s model calls, 4 laps at once per process against no limit, paired:
0.82 against 0.74 of the ideal lap rate, 0.8 ms less of the machine's CPU a
lap (BENCHMARKS.md, "How many runs one machine keeps moving"). Fewer than 4
left the interpreter idle while laps waited on Postgres; 8 gained little.

A lap holds its place while it works (claim, request, parsing, journal,
commit, hand-off) and gives it up while it waits on something outside: its
model call, its tool calls, its compensations. The place is per thread and
re-entrant; a thread that does not hold one (a tool's own thread, a lap run
outside a worker) passes ``waiting`` untouched.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class _Places:
    """A semaphore that hands a freed place straight to the longest waiter.

    ``threading.Semaphore`` wakes a waiter, which must then win the place
    against whoever arrives meanwhile; one that loses waits again at the back.
    Under a wave of hundreds of laps that is both unfair (the order this gate
    exists for is lost) and dear (waiters woken for nothing, each a GIL and
    futex round). Here each waiter sleeps on a lock of its own, and a release
    with waiters passes its place on without ever freeing it."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._lock = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()

    def acquire(self) -> None:
        with self._lock:
            if self._free:
                self._free -= 1
                return
            mine = threading.Lock()
            mine.acquire()
            self._waiters.append(mine)
        mine.acquire()  # released by the release() that hands us its place

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._free += 1


class ActiveLaps:
    """At most ``limit`` laps of this process between ``held`` and its end,
    outside their ``waiting`` blocks; 0: no limit."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._places = _Places(limit) if limit else None
        self._mine = threading.local()

    def _holds(self) -> bool:
        return bool(getattr(self._mine, "held", False))

    @contextmanager
    def held(self) -> Iterator[None]:
        """A place for the whole lap (waiting for one if all are taken)."""
        if self._places is None or self._holds():
            yield
            return
        self._places.acquire()
        self._mine.held = True
        try:
            yield
        finally:
            self._mine.held = False
            self._places.release()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The place given up while the lap waits outside, taken back after."""
        if self._places is None or not self._holds():
            yield
            return
        self._mine.held = False
        self._places.release()
        try:
            yield
        finally:
            self._places.acquire()
            self._mine.held = True


__all__ = ["ActiveLaps"]
