"""SQL of a run's readable and steerable state: the latest
committed state in one query, operators' pending edits and their fenced
application by a lap's commit.

An edit is a row, never a write to the checkpoint: the lap that claims the run
next loads the pending rows and its fenced commit marks them applied
(``applied_lap``) in the same transaction that stores the checkpoint carrying
them. So an edit requested while a lap runs is applied by the next lap (the
running one loaded the pending rows at its claim), never under it; a lap that
loses its lease writes nothing, and the edit stays pending for the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Table, and_, func, insert, select, update

from agent_worker.core.errors import InvalidStateError
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.store.base import RunRecord
from agent_worker.store.edits import StateEdit
from agent_worker.store.models import StateEditRow
from agent_worker.store.rows import checkpoints, record_event_tx, require_run, runs, to_run

state_edits = cast(Table, StateEditRow.__table__)


@dataclass(frozen=True)
class RunState:
    """A run's record with its latest committed checkpoint (as stored)."""

    run: RunRecord
    checkpoint: dict[str, Any]
    pending_edits: int


class StateStore(Protocol):
    """What ``get_state`` and ``update_state`` need from the store."""

    def run_state(self, run_id: str) -> RunState | None: ...

    def request_state_edit(self, run_id: str, edit: dict[str, Any], *, by: str,
                           now: datetime) -> StateEdit: ...


def run_state(conn: Connection, run_id: str) -> RunState | None:
    """The run row, its latest checkpoint and its count of pending edits, in
    one statement. The latest checkpoint is ``next_lap - 1``'s: the lap in
    flight (if any) has not committed, and retention never prunes the latest."""
    pending = (select(func.count()).select_from(state_edits)
               .where(state_edits.c.run_id == runs.c.id, _pending())
               .correlate(runs).scalar_subquery())
    q = (select(runs, checkpoints.c.state.label("checkpoint_state"),
                pending.label("pending_edits"))
         .join(checkpoints, and_(checkpoints.c.run_id == runs.c.id,
                                 checkpoints.c.lap == runs.c.next_lap - 1))
         .where(runs.c.id == run_id))
    row = conn.execute(q).first()
    if row is None:
        return None
    return RunState(to_run(row), row.checkpoint_state, int(row.pending_edits or 0))


def pending_clause() -> Any:
    """Edits not yet applied nor dropped."""
    return _pending()


def _pending() -> Any:
    return and_(state_edits.c.applied_lap.is_(None), state_edits.c.dropped_lap.is_(None))


def pending_edits(conn: Connection, run_id: str) -> list[StateEdit]:
    """Edits not yet applied, oldest first (loaded by the claim)."""
    q = (select(state_edits).where(state_edits.c.run_id == run_id, _pending())
         .order_by(state_edits.c.id))
    return [StateEdit(**r._mapping) for r in conn.execute(q)]


def request_edit(conn: Connection, run_id: str, edit: dict[str, Any], *, by: str,
                 now: datetime) -> StateEdit:
    """Store an edit for the next lap. The run row is locked so a finishing
    lap cannot slip between the check and the insert (an edit accepted for a
    run that then never runs again would be lost silently).

    Raises:
        UnknownRunError: no such run.
        InvalidStateError: the run has finished.
    """
    run = require_run(conn, run_id, lock=True)
    if run.status in TERMINAL:
        raise InvalidStateError(f"run {run_id} is {run.status}; its state can no longer "
                                "change (fork it to continue from an edited state)")
    row = conn.execute(insert(state_edits).values(
        run_id=run_id, edit=edit, requested_by=by, created_at=now, applied_lap=None,
        dropped_lap=None,
    ).returning(*state_edits.c)).one()
    record_event_tx(conn, run_id, None, "state_update_requested",
                    {"edit": row.id, "by": by, "fields": sorted(edit)}, now)
    return StateEdit(**row._mapping)


def mark_applied(conn: Connection, run_id: str, lap: int, ids: Sequence[int],
                 now: datetime) -> None:
    """Inside the lap's fenced commit: mark ``ids`` applied by ``lap``.

    Raises:
        InvalidStateError: an edit was already applied (rolls the commit back;
            cannot happen under the lease fence, and must not pass silently).
    """
    if not ids:
        return
    done = conn.execute(update(state_edits).where(
        state_edits.c.run_id == run_id, state_edits.c.id.in_(list(ids)),
        _pending()).values(applied_lap=lap))
    if done.rowcount != len(ids):
        raise InvalidStateError(f"run {run_id} lap {lap}: a state edit was already applied")
    record_event_tx(conn, run_id, lap, "state_updated", {"edits": list(ids)}, now)



def drop_pending(conn: Connection, run_id: str, lap: int, now: datetime) -> None:
    """Inside the transaction that ends a run (a final lap commit, or a
    release to failed or cancelled): edits still pending arrived during the
    final lap, after its claim loaded the pending ones, and no lap will apply
    them. They are marked dropped and the events say so (``state_edits_dropped``):
    refused after the fact, never silently kept as "pending" on a finished run."""
    dropped = [r.id for r in conn.execute(
        update(state_edits).where(state_edits.c.run_id == run_id, _pending())
        .values(dropped_lap=lap).returning(state_edits.c.id))]
    if dropped:
        record_event_tx(conn, run_id, lap, "state_edits_dropped",
                        {"edits": sorted(dropped), "reason": "the run finished first"}, now)


__all__ = ["RunState", "StateStore", "drop_pending", "mark_applied", "pending_clause",
           "pending_edits", "request_edit", "run_state", "state_edits"]
