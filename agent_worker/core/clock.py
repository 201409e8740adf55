"""Time, injectable: tests drive timers, leases and deadlines with a clock they
control instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    """Wall-clock time: this host's idea of it, right or wrong."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        self._now += timedelta(**delta)
        return self._now


class DatabaseClock:
    """The database's time, on a host whose own clock may be wrong (one whose
    skew let a lease be taken early or outlive its worker). Read from the
    database every ``refresh_seconds`` and carried forward on the monotonic
    clock, so neither a skewed nor a stepped wall clock moves it. The deadlines
    a lap computes (a sleep's wake time, a retry's backoff, an approval's
    timeout) and its own checks of them then agree with the sweeper and the
    claim, which compare on the database's clock in SQL."""

    def __init__(self, read: Callable[[], datetime], *, refresh_seconds: float = 30.0) -> None:
        self._read = read
        self.refresh_seconds = refresh_seconds
        self._anchor: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        if self._anchor is None or time.monotonic() - self._anchor[1] >= self.refresh_seconds:
            try:
                sent = time.monotonic()
                db = self._read()
                back = time.monotonic()
                # The database read its clock somewhere in the round trip: say halfway.
                self._anchor = (db + timedelta(seconds=(back - sent) / 2), back)
            except Exception:
                if self._anchor is None:
                    raise
                # The database is unreachable: carry the last reading forward
                # (anything this time is for will fail on the store anyway).
        at, mono = self._anchor
        return at + timedelta(seconds=time.monotonic() - mono)
