"""Checks that a verb which resumes a run's history (``retry``) may: the
history must still stand as recorded. Helpers take a connection and never
commit."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from agent_worker.core.errors import ReplayRefusedError
from agent_worker.store.rows import checkpoints, effects, messages


def _pruned(conn: Connection, run_id: str) -> bool:
    """Whether retention deleted part of the run's messages (and with them its
    ledger): the latest checkpoint counts more messages than are left."""
    state = conn.execute(
        select(checkpoints.c.state).where(checkpoints.c.run_id == run_id)
        .order_by(checkpoints.c.lap.desc()).limit(1)).scalar()
    expected = int((state or {}).get("message_count", 0))
    kept = conn.execute(select(func.count()).select_from(messages).where(
        messages.c.run_id == run_id, messages.c.seq < expected)).scalar_one()
    return int(kept) < expected


def require_replayable(conn: Connection, run_id: str) -> None:
    """Refuse to resume a run whose history no longer stands.

    Raises:
        ReplayRefusedError: some effect was compensated (resuming would act as
            if it still stood), or retention pruned the run's messages and ledger
            (resuming would repeat effects).
    """
    undone = conn.execute(select(effects.c.key).where(
        effects.c.run_id == run_id, effects.c.status == "compensated")).scalars().all()
    if undone:
        raise ReplayRefusedError(
            f"run {run_id} had {len(undone)} effect(s) compensated ({', '.join(undone[:3])}); "
            "retrying would resume as if they still stood. Start a new run, or `fork` it "
            "from a lap before those effects")
    if _pruned(conn, run_id):
        raise ReplayRefusedError(
            f"run {run_id}: its history was pruned by retention; it cannot be retried "
            "(replaying it would repeat its effects). Start a new run")


__all__ = ["require_replayable"]
