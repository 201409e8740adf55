"""Wake-ups that cannot be lost (DESIGN.md invariant "A wake-up cannot be lost").

A lap decides to wait after reading the signals and approvals it waits for;
a signal or a decision can arrive between that read and the lap's commit.
The verb that delivers it only wakes runs that are already ``waiting``, and the
run is still ``running`` then, so without this check the run would wait for
something that already came.

Both sides lock the run row: the verb (``require_run(lock=True)``) before it
writes, the lap commit with its fenced UPDATE. Whichever comes second sees the
other's write: a verb that commits first is found by ``recheck`` here; a verb
that comes after finds the run ``waiting`` and wakes it itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, select, update

from agent_worker.core.vocabulary import WaitingFor
from agent_worker.store import children
from agent_worker.store.dbtime import db_time
from agent_worker.store.rows import approvals, record_event_tx, runs, signals


def _arrived(conn: Connection, run_id: str, waiting_for: WaitingFor,
            delivered: Sequence[int] = ()) -> bool:
    """Whether what ``waiting_for`` names is already there: an undelivered
    signal of that name (other than those this commit delivers), or a decided
    approval."""
    kind, name = waiting_for.kind, waiting_for.ref
    if kind == "signal":
        q = select(signals.c.id).where(signals.c.run_id == run_id, signals.c.name == name,
                                       signals.c.delivered_lap.is_(None))
        if delivered:
            q = q.where(signals.c.id.not_in(delivered))
        return conn.execute(q.limit(1)).first() is not None
    if kind == "approval":
        q = select(approvals.c.id).where(approvals.c.id == name,
                                         approvals.c.status != "pending")
        return conn.execute(q).first() is not None
    if kind == "children":
        return children.arrived(conn, waiting_for)
    return False


def recheck(conn: Connection, run_id: str, lap: int, waiting_for: WaitingFor | None, *,
            delivered: Sequence[int], now: datetime) -> bool:
    """Inside the lap commit that just set the run ``waiting``: if what it
    waits for arrived meanwhile, queue the run instead (the caller sends it).
    Returns whether it did."""
    if waiting_for is None or not _arrived(conn, run_id, waiting_for, delivered):
        return False
    conn.execute(update(runs).where(runs.c.id == run_id, runs.c.status == "waiting")
                 .values(status="queued", waiting_for=None, wake_at=None,
                         # the hand-off starts on the database's clock (store.dbtime)
                         enqueued_at=db_time(now),
                         updated_at=now))
    record_event_tx(conn, run_id, lap, "woken", {"arrived": waiting_for.format()}, now)
    return True


__all__ = ["recheck"]
