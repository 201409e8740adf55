"""When a schedule fires: cron expressions in a time zone, via ``croniter``.

Cron fields are read in the schedule's IANA time zone (``zoneinfo``) and every
fire time is handed out as an aware UTC instant, the form the store compares
on the database's clock. Five fields (minute hour day month weekday) or six
(croniter's sixth field is seconds).

Daylight-saving days, for a schedule at ``30 2 * * *`` (what croniter does,
plus one rule of ours; ``tests/engine/test_schedule_times.py`` checks both):

- **spring forward** (02:00 → 03:00, 02:30 never happens): it fires once, at
  03:00 local, the instant the skipped hour ends;
- **fall back** (03:00 → 02:00, 02:30 happens twice): it fires once, at the
  first 02:30. croniter yields both; like cron, a schedule with a fixed hour
  skips the repeated one (a nightly job must not run twice). A schedule whose
  hour field is ``*`` keeps firing through the repeated hour, as its interval
  says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from agent_worker.core.errors import InvalidScheduleError

#: Longest cron expression or time-zone name accepted.
MAX_CRON_CHARS = 200
#: Walking back from just past ``until`` makes a fire time at ``until`` itself due.
_SEARCH = timedelta(microseconds=1)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``.

    Raises:
        InvalidScheduleError: no such zone.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_CRON_CHARS or "\x00" in name:
        raise InvalidScheduleError(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as e:
        raise InvalidScheduleError(f"unknown time zone {name!r}") from e


def check_cron(expr: str, tz: str, now: datetime | None = None) -> str:
    """``expr`` normalised (single spaces) if it is a cron expression that fires.

    Raises:
        InvalidScheduleError: not 5 or 6 fields, a field out of range, or a
            date that never comes (``0 0 30 2 *``).
    """
    if not isinstance(expr, str) or len(expr) > MAX_CRON_CHARS:
        raise InvalidScheduleError(f"invalid cron expression {str(expr)[:MAX_CRON_CHARS]!r}")
    fields = expr.split()
    if len(fields) not in (5, 6) or not croniter.is_valid(" ".join(fields)):
        raise InvalidScheduleError(
            f"invalid cron expression {expr!r}: five fields (minute hour day month "
            "weekday), or six with seconds last")
    normal = " ".join(fields)
    try:
        next_after(normal, tz, now or datetime.now(UTC))
    except InvalidScheduleError as e:
        raise InvalidScheduleError(f"cron expression {expr!r} never fires") from e
    return normal


def _fixed_hour(expr: str) -> bool:
    return bool(croniter(expr).expanded[1] != ["*"])


def _repeated(t: datetime, tz: ZoneInfo) -> bool:
    """Whether ``t`` (local, aware) is the second occurrence of its wall time."""
    first = t.replace(tzinfo=None).replace(tzinfo=tz, fold=0)
    return first.utcoffset() != t.utcoffset()


def _iter(expr: str, tz: str, start: datetime) -> croniter:
    try:
        return croniter(expr, start.astimezone(zone(tz)))
    except (CroniterBadCronError, ValueError) as e:
        raise InvalidScheduleError(f"invalid cron expression {expr!r}") from e


def next_after(expr: str, tz: str, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (aware UTC)."""
    it = _iter(expr, tz, after)
    fixed, zi = _fixed_hour(expr), zone(tz)
    try:
        while True:
            t: datetime = it.get_next(datetime)
            if not (fixed and _repeated(t, zi)):
                return t.astimezone(UTC)
    except CroniterBadDateError as e:
        raise InvalidScheduleError(f"cron expression {expr!r} never fires") from e


def latest(expr: str, tz: str, *, since: datetime, until: datetime, limit: int
           ) -> list[datetime]:
    """Up to ``limit`` of the most recent fire times ``t`` with
    ``since <= t <= until``, oldest first. Walks backwards from ``until``, so
    a beat that was down for a year costs ``limit`` steps, not a year's worth."""
    if limit <= 0 or until < since:
        return []
    it = _iter(expr, tz, until + _SEARCH)
    fixed, zi = _fixed_hour(expr), zone(tz)
    found: list[datetime] = []
    try:
        while len(found) < limit:
            t: datetime = it.get_prev(datetime)
            if t < since:
                break
            if not (fixed and _repeated(t, zi)):
                found.append(t.astimezone(UTC))
    except CroniterBadDateError:
        pass  # nothing earlier: found is complete
    return found[::-1]


__all__ = ["MAX_CRON_CHARS", "check_cron", "latest", "next_after", "zone"]
