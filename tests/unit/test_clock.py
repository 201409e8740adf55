"""``DatabaseClock``: the database's time, carried forward on
the monotonic clock, whatever the host's wall clock says."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from agent_worker.core.clock import DatabaseClock

DB_TIME = datetime(2030, 1, 1, tzinfo=UTC)


def test_reads_the_database_once_and_carries_it_forward() -> None:
    reads: list[float] = []

    def read() -> datetime:
        reads.append(time.monotonic())
        return DB_TIME

    clock = DatabaseClock(read, refresh_seconds=3600)
    first = clock.now()
    time.sleep(0.05)
    later = clock.now()
    assert len(reads) == 1
    assert DB_TIME <= first < DB_TIME + timedelta(seconds=1)
    assert timedelta(seconds=0.04) < later - first < timedelta(seconds=1)
    assert abs(later - datetime.now(UTC)) > timedelta(days=365), "the wall clock leaked in"


def test_reads_again_after_the_refresh_and_survives_a_failed_read() -> None:
    answers: list[datetime | Exception] = [DB_TIME, RuntimeError("db down"),
                                           DB_TIME + timedelta(hours=1)]

    def read() -> datetime:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = DatabaseClock(read, refresh_seconds=0)
    assert clock.now() < DB_TIME + timedelta(seconds=1)
    assert clock.now() < DB_TIME + timedelta(seconds=1)  # read failed: carried forward
    assert clock.now() >= DB_TIME + timedelta(hours=1)
    with pytest.raises(RuntimeError):
        DatabaseClock(lambda: (_ for _ in ()).throw(RuntimeError("never read"))).now()
