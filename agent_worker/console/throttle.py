"""Login throttling: after too many failed logins to one user name, or from one
client address, within a sliding window, further logins are refused (429 with
``Retry-After``) until the oldest failure leaves the window.

A successful login clears its user name's failures, not its address's: one
valid account must not buy an address more guesses at the others. A refused
attempt is not counted (it was never checked), so a throttled user is free
again once the window has passed, not later.

The counts live in this process's memory: each console process of a fleet
counts on its own (three replicas behind a balancer allow up to three times the
limits), and a restart forgets them. Times come from one monotonic clock
(``time.monotonic``; tests inject their own). The tables are bounded: an
attacker inventing user names fills ``max_keys`` entries at most, the oldest
dropped first.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

Clock = Callable[[], float]

#: Distinct user names (and, apart, addresses) remembered at most.
MAX_KEYS = 10_000
#: A typed user name is counted by its first this many characters.
MAX_NAME = 256


class _Window:
    """Failure times per key within ``window`` seconds, at most ``limit`` kept a key."""

    def __init__(self, limit: int, window: float, max_keys: int) -> None:
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self.failures: dict[str, deque[float]] = {}

    def _live(self, key: str, now: float) -> deque[float] | None:
        times = self.failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self.failures[key]
            return None
        return times

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may try again; 0 when it may now."""
        times = self._live(key, now)
        if times is None or len(times) < self.limit:
            return 0.0
        return times[0] + self.window - now

    def fail(self, key: str, now: float) -> None:
        times = self._live(key, now)
        if times is None:
            if len(self.failures) >= self.max_keys:
                self._prune(now)
            times = self.failures[key] = deque(maxlen=self.limit)
        times.append(now)

    def clear(self, key: str) -> None:
        self.failures.pop(key, None)

    def _prune(self, now: float) -> None:
        for key in list(self.failures):
            self._live(key, now)
        while len(self.failures) >= self.max_keys:  # all live: forget the oldest
            del self.failures[next(iter(self.failures))]


class LoginThrottle:
    """Failed logins per user name and per client address, in one process."""

    def __init__(self, *, per_user: int, per_address: int, window_seconds: float,
                 clock: Clock = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        self._users = _Window(per_user, window_seconds, max_keys)
        self._addresses = _Window(per_address, window_seconds, max_keys)
        self._clock = clock
        self._lock = threading.Lock()

    def retry_after(self, user: str, address: str) -> int:
        """Whole seconds (at least 1) until a login of ``user`` from ``address``
        may be tried; 0 when it may be tried now."""
        with self._lock:
            now = self._clock()
            wait = max(self._users.wait(user[:MAX_NAME], now),
                       self._addresses.wait(address, now))
        return max(1, math.ceil(wait)) if wait > 0 else 0

    def failed(self, user: str, address: str) -> None:
        """Count a wrong password (or unknown user) for both."""
        with self._lock:
            now = self._clock()
            self._users.fail(user[:MAX_NAME], now)
            self._addresses.fail(address, now)

    def succeeded(self, user: str) -> None:
        """``user`` logged in: its failures are forgotten (its address's are not)."""
        with self._lock:
            self._users.clear(user[:MAX_NAME])


__all__ = ["Clock", "LoginThrottle"]
