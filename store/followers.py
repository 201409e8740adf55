"""Who follows a run's stream (migration ``0023_notify_followed``): the
event trigger sends its ``NOTIFY`` only for a run someone follows.

A transaction that sent a ``NOTIFY`` commits under one lock for the whole
Postgres cluster (``PreCommit_Notify`` takes it; it is held through the
commit's WAL flush), so while every event notified, every lap commit of the
fleet queued behind the one before it, flush by flush, instead of sharing a
flush with the laps committing beside it (BENCHMARKS.md, "Lap commits no
longer queue behind NOTIFY"). Nobody follows most runs, so most commits
now take no such lock.

A follower's row says "until ``expires_at``": a reader renews it while it
waits and deletes it when it stops; one that died without deleting it stops
counting at ``expires_at`` and is removed by the next registration. Which
runs are followed is a tenant's to see, so the table has the forced policy of
the child tables (migration ``0024_append_only_audit``): a row is visible when
its run is. The trigger's check is still one index probe per event insert;
the system scope passes the policy's first arm without the run lookup, and
the system role skips the policy altogether.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from agent_worker.store.modelbase import Base

#: How long a registration counts without being renewed; readers renew it at
#: half of that, so a live reader's never lapses between two of its waits.
FOLLOW_SECONDS = 60

#: Register (or renew) one follower and drop registrations that lapsed, in one
#: round trip; sent by psycopg itself, on the reader's own connection (hence
#: its placeholders). Times are the database's: naive UTC, like every
#: timestamp here.
FOLLOW = (
    "WITH lapsed AS (DELETE FROM event_followers WHERE expires_at < timezone('UTC', now())) "
    "INSERT INTO event_followers (follower, run_id, expires_at) VALUES (%(follower)s, "
    "%(run_id)s, timezone('UTC', now()) + make_interval(secs => %(seconds)s)) "
    "ON CONFLICT (follower) DO UPDATE SET expires_at = EXCLUDED.expires_at")
UNFOLLOW = "DELETE FROM event_followers WHERE follower = %(follower)s"
#: The transactions running right after a registration committed: any of them
#: may have inserted an event of the run before it could see the registration,
#: so no hint comes for that event when it commits.
RUNNING = "SELECT array_agg(x::text) FROM pg_snapshot_xip(pg_current_snapshot()) AS x"
#: How many of ``RUNNING``'s transactions are still running.
STILL_RUNNING = ("SELECT count(*) FROM unnest(%(xids)s::text[]) AS x "
                 "WHERE pg_xact_status(x::xid8) = 'in progress'")


class EventFollowerRow(Base):
    """One reader following one run's events, until ``expires_at``."""

    __tablename__ = "event_followers"

    follower: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime]

    __table_args__ = (Index("ix_event_followers_run", "run_id", "expires_at"),)


__all__ = ["FOLLOW", "FOLLOW_SECONDS", "RUNNING", "STILL_RUNNING", "UNFOLLOW",
           "EventFollowerRow"]
