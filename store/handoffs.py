"""Re-sending hand-offs nobody claimed: only messages the broker no longer holds.

The message of a queued run holds the run like a lease with no owner: a lap
lost with its message (a worker killed between commit and send, or while it
held the message before its claim; Redis killed at the send) must be sent
again. The age of a hand-off alone cannot tell a lost message from one waiting
in a long queue: re-sent by age, every lap of a backlog was sent again and
again (300 runs of 5 laps on one worker of concurrency 2 pushed 3.6 messages
a lap, and the duplicates made the queue, and the wait, longer still).

So the sweeper first reads how many messages each lap queue holds
(``store.queued.QueuedMessages``, from the broker) and compares them with the runs of that
version whose message is due: runnable, nobody holding them, due, not held
back by admission, sent before this pass. A queue that holds at least that
many is waiting, however long: nothing is re-sent. One that holds fewer has
lost that many, and the runs of the oldest hand-offs are re-sent: a lap queue
is first in, first out, so the sends before a lost message are delivered
before it and the lost one becomes the oldest unclaimed. A message a worker
has taken and not yet claimed is missing from the count too, for a moment
(longer when the worker's pool processes are busy, one of them with the
sweep itself), and it is the oldest: so a run counted missing is first only
suspected, and sent again if it is still unclaimed and still counted missing
``gone_seconds`` later (at the earliest that long after its hand-off, and
again at most that often). Lap messages in Redis thus stay at most one per
due run, plus the rare copy of a message that took longer than that to be
claimed; a stale copy (its run claimed through another) counts as waiting
until it is delivered and refused, which only delays a re-send.

Without a reading of a queue (the broker unreachable, a dispatcher that has
no queue to read), the rule falls back to age: a hand-off expires a lease TTL
after its send, and each re-send doubles the wait, up to ``most``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from agent_worker.store.models import UTCDateTime
from agent_worker.store.queued import Version
from agent_worker.store.rows import runs
from agent_worker.store.runstatus import waiting_turn
from agent_worker.store.statements import NOT_THROTTLED
from agent_worker.store.values import DueLap


def _versions(pairs: set[Version]) -> ColumnElement[bool]:
    return or_(*(and_(runs.c.agent_name == n, runs.c.agent_version == v) for n, v in pairs))


def _expired(now: datetime, after: timedelta) -> ColumnElement[bool]:
    """The hand-off is older than ``after``, or its last re-send's wait is over
    (kept in ``lease_expires_at``, unused while nobody holds the run)."""
    return or_(runs.c.lease_expires_at < now, and_(
        runs.c.lease_expires_at.is_(None),
        or_(runs.c.enqueued_at.is_(None), runs.c.enqueued_at < now - after)))


def _due(now: datetime) -> ColumnElement[bool]:
    # A run waiting for a slot has no message to lose (store.admitting).
    return and_(waiting_turn(), or_(runs.c.wake_at.is_(None), runs.c.wake_at <= now),
                NOT_THROTTLED)


def _pick(conn: Connection, cond: ColumnElement[bool], limit: int) -> list[Any]:
    return list(conn.execute(
        select(runs.c.id, runs.c.enqueued_at, runs.c.lease_expires_at, runs.c.wake_at,
               runs.c.next_lap, runs.c.agent_name, runs.c.agent_version)
        .where(cond).order_by(runs.c.enqueued_at.asc().nulls_first(), runs.c.id)
        .limit(limit).with_for_update(skip_locked=True, of=runs)).all())


def _missing(conn: Connection, now: datetime, lengths: Mapping[Version, int]
             ) -> dict[Version, int]:
    """Messages each read queue lacks: due runs sent before this pass (the
    laps this pass recovered or woke are sent by it) minus what it holds."""
    sent_before = or_(runs.c.enqueued_at.is_(None), runs.c.enqueued_at < now)
    expected = conn.execute(
        select(runs.c.agent_name, runs.c.agent_version, func.count())
        .where(_due(now), sent_before, _versions(set(lengths)))
        .group_by(runs.c.agent_name, runs.c.agent_version)).all()
    return {(n, v): int(c) - lengths[(n, v)] for n, v, c in expected
            if int(c) > lengths[(n, v)]}


def resend_unclaimed(conn: Connection, now: datetime, live: set[Version], *,
                     handoff: timedelta, most: timedelta, lengths: Mapping[Version, int],
                     gone: timedelta, limit: int) -> list[DueLap]:
    """The queued laps of ``live`` versions to send again (module docstring),
    their next re-send's wait recorded: by count for the versions whose queue
    ``lengths`` holds, by age for the others. ``now`` is the database's."""
    read = {p: n for p, n in lengths.items() if p in live}
    rows: list[Any] = []
    for version, count in sorted(_missing(conn, now, read).items()) if read else ():
        rows += _pick(conn, and_(_due(now), _versions({version}), _expired(now, gone)),
                      min(count, limit - len(rows)))
        if len(rows) >= limit:
            break
    counted = len(rows)
    unread = live - set(read)
    if unread and len(rows) < limit:
        rows += _pick(conn, and_(_due(now), _versions(unread), _expired(now, handoff)),
                      limit - len(rows))
    if not rows:
        return []
    conn.execute(
        update(runs).where(runs.c.id == bindparam("rid"))
        .values(lease_expires_at=bindparam("expiry", type_=UTCDateTime()),
                enqueued_at=bindparam("since", type_=UTCDateTime())),
        [{"rid": r.id, "since": r.enqueued_at or now,
          "expiry": now + (gone if i < counted
                           else min(max(now - (r.enqueued_at or now), handoff), most))}
         for i, r in enumerate(rows)])
    # Counted short, a run is first only suspected: the message a worker has
    # taken and not yet claimed (its pool process busy with the sweep itself)
    # is missing from the count for that moment, and it is the oldest. Still
    # missing ``gone`` later, at the next count, it is sent. A run whose retry
    # wait (``wake_at``) is over was never sent since: no suspicion needed.
    return [DueLap(r.id, r.next_lap, r.agent_name, r.agent_version)
            for i, r in enumerate(rows)
            if i >= counted or r.lease_expires_at is not None or r.wake_at is not None]


__all__ = ["resend_unclaimed"]
