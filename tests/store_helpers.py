"""Store helpers only tests need (erasing a run's rows). They live here,
not on ``SqlStore``, so the production store carries only what the protocol
promises."""

from __future__ import annotations

from sqlalchemy import Connection, delete

from store.rows import approvals, checkpoints, effects, events, messages, runs, signals
from store.sql import SqlStore


def delete_run(store: SqlStore, run_id: str) -> None:
    """Remove every row of a run."""
    def tx(conn: Connection) -> None:
        for t in (messages, checkpoints, effects, events, signals, approvals):
            conn.execute(delete(t).where(t.c.run_id == run_id))
        conn.execute(delete(runs).where(runs.c.id == run_id))

    with store.engine.begin() as conn:
        tx(conn)
