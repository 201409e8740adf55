"""What a stream reader needs from the database beyond the audit log itself:
a wake-up when a run's events change, and the messages one lap committed.

The events table is the truth; a wake-up is only a hint to read it now. On
Postgres the hint is ``LISTEN`` on the run's channel, sent by the trigger of
migration ``0006_stream_trace`` at commit (never for a rollback, never before
the rows are visible), on a connection of its own, and only for a run with a
registered follower (``store.followers``: a notifying commit would otherwise
queue every lap commit of the cluster behind it). Elsewhere (SQLite, the
in-process mode) there is no channel and the reader polls. Either way a lost
hint costs at most one poll interval, never an event.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Protocol

import psycopg
from psycopg import sql
from sqlalchemy import Engine, select

from agent_worker.store import tenancy
from agent_worker.store.base import StoredMessage
from agent_worker.store.followers import FOLLOW, FOLLOW_SECONDS, RUNNING, STILL_RUNNING, UNFOLLOW
from agent_worker.store.rows import messages, to_message


class EventWaiter(Protocol):
    """Blocks until the run's events may have changed, or ``timeout`` passes."""

    def wait(self, timeout: float) -> bool:
        """``True`` if woken by a notification, ``False`` on timeout."""
        ...

    def close(self) -> None: ...


def channel(run_id: str) -> str:
    """The run's notification channel: identifiers stop at 63 bytes, run ids
    do not, so the channel is named by a hash (the trigger computes the same)."""
    return "aw_ev_" + hashlib.md5(run_id.encode()).hexdigest()


class PollWaiter:
    """No channel: sleep the poll interval."""

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False

    def close(self) -> None:
        pass


class PgEventWaiter:
    """``LISTEN`` on one run's channel, on a psycopg connection of its own
    (a pooled connection would go back to the pool still listening), and
    registered as a follower of the run, renewed while it waits.

    A registration is seen only by event triggers that run after it commits.
    An event inserted just before, by a transaction that commits after the
    reader's read, would send no hint; so after each registration the first
    wait lasts only until the transactions running at that moment have ended
    (polled, at most ``SETTLE_SECONDS``) and then says "read again"."""

    #: Longest a wait watches the transactions running at a registration;
    #: one still running after that is left to the reader's next poll.
    SETTLE_SECONDS = 1.0

    def __init__(self, engine: Engine, run_id: str) -> None:
        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn = psycopg.connect(url, autocommit=True)
        self._follow_params = {"follower": uuid.uuid4().hex, "run_id": run_id,
                               "seconds": FOLLOW_SECONDS}
        self._renew_at = 0.0
        self._unsettled: list[str] = []
        try:
            # ``event_followers`` is under row-level security (0024) and this
            # connection is not the engine's: it sets the scope itself, for the
            # session: the principal's tenant inside ``scope``, else the
            # system scope the engine's connections start with.
            self._conn.execute("SELECT set_config(%s, %s, false)",
                               (tenancy.SETTING, tenancy.current() or tenancy.SYSTEM))
            # Subscribed before registered: every hint the registration lets
            # the trigger send arrives.
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(run_id))))
            self._follow()
        except BaseException:
            self._conn.close()
            raise

    def _follow(self) -> None:
        self._conn.execute(FOLLOW, self._follow_params)
        # After the registration's commit (autocommit), not in its statement:
        # a transaction begun in between would be in neither.
        found = self._conn.execute(RUNNING).fetchone()
        self._unsettled = list(found[0] or []) if found else []
        self._renew_at = time.monotonic() + FOLLOW_SECONDS / 2

    def wait(self, timeout: float) -> bool:
        if time.monotonic() >= self._renew_at:
            self._follow()
        if self._unsettled:
            return self._settle(timeout)
        woken = False
        for _ in self._conn.notifies(timeout=timeout, stop_after=1):
            woken = True
        if woken:
            # Drain what else arrived meanwhile: one read covers all of it.
            # (Not nested in the loop above: the generator holds the
            # connection's lock; and psycopg reads a timeout of 0 as none.)
            for _ in self._conn.notifies(timeout=0.001):
                pass
        return woken

    def _settle(self, timeout: float) -> bool:
        """Wait until the transactions running at the registration have
        ended, or ``timeout`` or ``SETTLE_SECONDS`` passed; ``True``: read
        again (what they committed sent no hint)."""
        deadline = time.monotonic() + min(timeout, self.SETTLE_SECONDS)
        pause = 0.005
        while True:
            found = self._conn.execute(STILL_RUNNING, {"xids": self._unsettled}).fetchone()
            if not found or not found[0] or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        self._unsettled = []
        return True

    def close(self) -> None:
        """Unregister, then disconnect. A registration that cannot be deleted
        (the connection died) lapses by itself within ``FOLLOW_SECONDS``."""
        try:
            self._conn.execute(UNFOLLOW, self._follow_params)
        except psycopg.Error:
            pass
        finally:
            self._conn.close()


def open_waiter(engine: Engine | None, run_id: str) -> EventWaiter:
    """A waiter for ``run_id``: ``LISTEN`` on Postgres, polling elsewhere.
    Opened *before* the reader reads its backlog, so nothing committed after
    that read goes unnoticed."""
    if engine is not None and engine.dialect.name == "postgresql":
        return PgEventWaiter(engine, run_id)
    return PollWaiter()


def lap_messages(engine: Engine, run_id: str, lap: int, *,
                 from_seq: int | None = None) -> list[StoredMessage]:
    """The messages lap ``lap`` wrote (the model's answer with its tool calls,
    then their results), in order. A reader following the run passes
    ``from_seq`` (one past the last message it has shown) so the read walks
    the primary key from there instead of the run's whole log."""
    q = select(messages.c.seq, messages.c.lap, messages.c.body).where(
        messages.c.run_id == run_id).order_by(messages.c.seq)
    if from_seq is None:
        q = q.where(messages.c.lap == lap)
    else:
        q = q.where(messages.c.seq >= from_seq, messages.c.lap <= lap)
    with engine.connect() as conn:
        return [to_message(r) for r in conn.execute(q).all()]


__all__ = ["EventWaiter", "PgEventWaiter", "PollWaiter", "channel", "lap_messages",
           "open_waiter"]
