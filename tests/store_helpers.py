"""Store helpers only tests need (erasing runs' rows, ending fair share for the
tests after). They live here, not on ``SqlStore``, so the production store
carries only what the protocol promises."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, select

from store.admitting import THROTTLED
from store.rows import approvals, checkpoints, effects, events, messages, runs, signals
from store.runstatus import waiting_turn
from store.sharing import share_limits
from store.sql import SqlStore


def _erase(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete the runs' rows in the tables a run writes to (none has a foreign key)."""
    for t in (messages, checkpoints, effects, events, signals, approvals):
        conn.execute(delete(t).where(t.c.run_id.in_(run_ids)))
    conn.execute(delete(runs).where(runs.c.id.in_(run_ids)))


def delete_run(store: SqlStore, run_id: str) -> None:
    """Remove every row of a run."""
    with store.engine.begin() as conn:
        _erase(conn, [run_id])


def end_fair_share(url: str) -> None:
    """End fair share in the database at ``url``: delete every row of the
    limits table and every run waiting for a slot. On Postgres the database is
    the whole test session's, and what a test leaves there slows every later
    test: one limit row switches admission on for every worker (each Postgres
    lap about ten times slower), and one waiting run makes every sweep take the
    admission lock and read the lines (measured: 75 ms a sweep instead of 15). The
    session's tests run one at a time on the database, so at a test's teardown
    no other test's limits are in force and the waiting runs are finished
    tests' leftovers (nobody else admits them: their agents were private)."""
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
