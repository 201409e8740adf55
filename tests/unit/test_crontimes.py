"""Fire times of a cron expression in a time zone, on the days daylight
saving moves the clock (the rule documented in ``engine.crontimes``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_worker.core.errors import InvalidScheduleError
from agent_worker.engine.crontimes import check_cron, latest, next_after, zone

BERLIN = "Europe/Berlin"  # spring forward 2026-03-29 02:00→03:00, fall back 2026-10-25 03:00→02:00


def _utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
         second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def _fires(expr: str, since: datetime, until: datetime) -> list[datetime]:
    out, t = [], since
    while (t := next_after(expr, BERLIN, t)) <= until:
        out.append(t)
    return out


def test_a_0230_schedule_fires_at_0300_on_the_spring_forward_day() -> None:
    fires = _fires("30 2 * * *", _utc(2026, 3, 28, 0), _utc(2026, 3, 30, 12))
    assert fires == [_utc(2026, 3, 28, 1, 30),   # 02:30 CET
                     _utc(2026, 3, 29, 1, 0),    # 02:30 does not exist: 03:00 CEST, once
                     _utc(2026, 3, 30, 0, 30)]   # 02:30 CEST


def test_a_0230_schedule_fires_once_on_the_fall_back_day() -> None:
    fires = _fires("30 2 * * *", _utc(2026, 10, 24, 0), _utc(2026, 10, 26, 12))
    # 02:30 happens twice on the 25th (00:30 and 01:30 UTC): only the first fires.
    assert fires == [_utc(2026, 10, 24, 0, 30), _utc(2026, 10, 25, 0, 30),
                     _utc(2026, 10, 26, 1, 30)]
    # Walking backwards (catch-up) sees the same fire times.
    assert latest("30 2 * * *", BERLIN, since=_utc(2026, 10, 24, 0),
                  until=_utc(2026, 10, 26, 12), limit=10) == fires


def test_an_hourly_schedule_keeps_its_interval_through_the_repeated_hour() -> None:
    fires = _fires("30 * * * *", _utc(2026, 10, 25, 0), _utc(2026, 10, 25, 2))
    assert fires == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 25, 1, 30)]


def test_latest_walks_back_from_until_and_is_bounded() -> None:
    got = latest("* * * * * *", "UTC", since=_utc(2026, 1, 1), until=_utc(2026, 1, 2), limit=3)
    assert got == [_utc(2026, 1, 1, 23, 59, 58), _utc(2026, 1, 1, 23, 59, 59), _utc(2026, 1, 2)]


@pytest.mark.parametrize("expr", ["", "61 * * * *", "* * * *", "* * * * * * *", "a b c d e",
                                  "0 0 30 2 *", "x" * 300])
def test_invalid_or_never_firing_cron_is_refused(expr: str) -> None:
    with pytest.raises(InvalidScheduleError):
        check_cron(expr, "UTC")


@pytest.mark.parametrize("name", ["", "Mars/Olympus", "../../etc/passwd", "UTC\x00"])
def test_unknown_time_zone_is_refused(name: str) -> None:
    with pytest.raises(InvalidScheduleError):
        zone(name)
