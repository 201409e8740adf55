"""Store helpers only tests need (erasing a run's rows, ending what earlier
tests left in the session's database). They live here, not on ``SqlStore``,
so the production store carries only what the protocol promises."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Connection, delete, update

from agent_worker.messages import Message
from agent_worker.vocabulary import TERMINAL
from store.admitting import THROTTLED
from store.base import NewRun
from store.db import make_engine
from store.rows import approvals, checkpoints, effects, events, messages, runs, signals
from store.sharing import share_limits
from store.sql import SqlStore


def new_run(run_id: str, agent: str = "a", *, now: datetime, tenant: str | None = "t1",
            version: str = "1") -> NewRun:
    """A queued run of ``agent`` with one user message and an empty checkpoint."""
    return NewRun(id=run_id, tenant=tenant, agent_name=agent, agent_version=version,
                  input={}, limits={}, retention="full",
                  checkpoint={"schema_version": 2, "message_count": 1}, schema_version=2,
                  messages=[Message(role="user", content="hi")], now=now)


def delete_run(store: SqlStore, run_id: str) -> None:
    """Remove every row of a run."""
    def tx(conn: Connection) -> None:
        for t in (messages, checkpoints, effects, events, signals, approvals):
            conn.execute(delete(t).where(t.c.run_id == run_id))
        conn.execute(delete(runs).where(runs.c.id == run_id))

    with store.engine.begin() as conn:
        tx(conn)


def end_fair_share(url: str) -> None:
    """Remove every share limit and cancel every run still waiting for a slot.

    The Postgres database is the session's: a cap a test leaves in the limits
    table switches admission on for every later test's laps, and its waiting
    runs make each of their admission passes read a line (in session 14 the
    lifecycle model ran 7 times slower after the fair-share tests than alone).
    """
    engine, now = make_engine(url), datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(delete(share_limits))
            conn.execute(update(runs).where(runs.c.status == "queued",
                                            runs.c.admitted_lap == THROTTLED)
                         .values(status="cancelled", admitted_lap=None,
                                 cancel_reason="left waiting by a fair-share test",
                                 finished_at=now, updated_at=now))
    finally:
        engine.dispose()


def end_unfinished_runs(url: str) -> None:
    """Cancel every run of the session's database that has not ended.

    For tests whose subject is what sweeps do: runs earlier tests left
    queued, running, sleeping or waiting are due at every sweep after a
    clock jump and would be re-sent with the test's own (in the lifecycle
    model, whose every example sweeps dozens of times after hour-long jumps,
    that more than doubled its time in the suite)."""
    engine, now = make_engine(url), datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.status.not_in(TERMINAL))
                         .values(status="cancelled", lease_owner=None, lease_expires_at=None,
                                 enqueued_at=None, wake_at=None,
                                 cancel_reason="left unfinished by an earlier test",
                                 finished_at=now, updated_at=now))
    finally:
        engine.dispose()
