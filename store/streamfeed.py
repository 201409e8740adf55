"""What a stream reader needs from the database beyond the audit log itself:
a wake-up when a run's events change, and the messages one lap committed.

The events table is the truth; a wake-up is only a hint to read it now. On
Postgres the hint is ``LISTEN`` on the run's channel, sent by the trigger of
migration ``0006_stream_trace`` at commit (never for a rollback, never before
the rows are visible), on a connection of its own. Elsewhere (SQLite, the
in-process mode) there is no channel and the reader polls. Either way a lost
hint costs at most one poll interval, never an event.
"""

from __future__ import annotations

import hashlib
import time
from typing import Protocol

import psycopg
from psycopg import sql
from sqlalchemy import Engine, select

from store.base import StoredMessage
from store.rows import messages, to_message


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
    (a pooled connection would go back to the pool still listening)."""

    def __init__(self, engine: Engine, run_id: str) -> None:
        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn = psycopg.connect(url, autocommit=True)
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(run_id))))

    def wait(self, timeout: float) -> bool:
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

    def close(self) -> None:
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
