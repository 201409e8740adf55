"""Store helpers only tests need (erasing runs' rows, ending what earlier
tests left in the session's database). They live here, not on ``SqlStore``,
so the production store carries only what the protocol promises."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Connection, delete, select, update

from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.store.admitting import THROTTLED
from agent_worker.store.base import NewRun
from agent_worker.store.db import make_engine
from agent_worker.store.rows import approvals, checkpoints, effects, events, messages, runs, signals
from agent_worker.store.runstatus import waiting_turn
from agent_worker.store.sharing import share_limits
from agent_worker.store.sql import SqlStore


def _erase(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete the runs' rows in the tables a run writes to (none has a foreign key)."""
    for t in (messages, checkpoints, effects, events, signals, approvals):
        conn.execute(delete(t).where(t.c.run_id.in_(run_ids)))
    conn.execute(delete(runs).where(runs.c.id.in_(run_ids)))


def new_run(run_id: str, agent: str = "a", *, now: datetime, tenant: str | None = "t1",
            version: str = "1") -> NewRun:
    """A queued run of ``agent`` with one user message and an empty checkpoint."""
    return NewRun(id=run_id, tenant=tenant, agent_name=agent, agent_version=version,
                  input={}, limits={}, retention="full",
                  checkpoint={"schema_version": 2, "message_count": 1}, schema_version=2,
                  messages=[Message(role="user", content="hi")], now=now)


def delete_run(store: SqlStore, run_id: str) -> None:
    """Remove every row of a run."""
    with store.engine.begin() as conn:
        _erase(conn, [run_id])


def end_fair_share(url: str) -> None:
    """End fair share in the database at ``url``: delete every row of the
    limits table and every run waiting for a slot. On Postgres the database is
    the whole test session's, and what a test leaves there slows every later
    test: one limit row switches admission on for every worker, and one
    waiting run makes every sweep take the admission lock and read the lines
    (measured: 75 ms a sweep instead of 15; in session 14 the lifecycle model
    ran 7 times slower after the fair-share tests than alone). The session's
    tests run one at a time on the database, so at a test's teardown no other
    test's limits are in force and the waiting runs are finished tests'
    leftovers (nobody else admits them: their agents were private)."""
    store = SqlStore(url)
    try:
        with store.engine.begin() as conn:
            conn.execute(delete(share_limits))
            waiting = conn.execute(select(runs.c.id).where(
                waiting_turn(), runs.c.admitted_lap == THROTTLED)).scalars().all()
            if waiting:
                _erase(conn, waiting)
    finally:
        store.dispose()


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


@contextmanager
def sent_to_postgres() -> Iterator[list[str]]:
    """Every statement this process sends through psycopg meanwhile, whichever
    engine sends it (a store's own, or the relaxed one of its lap path,
    ``SqlBase``), without a listener on each."""
    sent: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def text(query: Any) -> str:
        return query.decode() if isinstance(query, bytes) else str(query)

    def sending(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(text(query))
        return execute(self, query, *args, **kwargs)

    def sending_many(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(text(query))
        return executemany(self, query, *args, **kwargs)

    psycopg.Cursor.execute = sending  # type: ignore[method-assign]
    psycopg.Cursor.executemany = sending_many  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
