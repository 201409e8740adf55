"""The one mapping between a run's stored ``status`` and the status readers
see: the claim and the lap commit store through ``STARTED`` and ``stored``;
every reader filters, counts and shows through ``status_is``, ``any_of``,
``in_flight``, ``waiting_turn``, ``shown_column`` and ``shown``.

Why they differ: HOT updates of the run row (migration ``0018_lap_hot``).
``status`` is in four indexes of the run row (as a key or a partial index's
predicate), so an update that changes it can never be a HOT update: it writes
a new entry into every index of the row (about 1.4 KB of WAL per lap, 26% of
it, measured in BENCHMARKS.md "HOT run-row updates"). A lap that flipped it
twice (the claim ``running``, the commit ``queued``) paid that on both.

So the stored ``running`` means "started and not paused or ended"; whether a
lap is *in flight* is the lease: the claim writes ``running`` (a no-op from
the second lap on) and a continuing lap's commit keeps it, clearing the lease.
Neither touches an indexed column, so with the room the table's fillfactor
keeps on each page both updates are HOT. Readers never see the difference:

=================  ===============  ============
stored ``status``  ``lease_owner``  shown
=================  ===============  ============
``running``        set              ``running``
``running``        NULL             ``queued``
``queued``         NULL             ``queued``
anything else      (any)            as stored
=================  ===============  ============

(A stored ``queued`` with a lease cannot arise: every claim writes
``running``, every writer of ``queued`` clears the lease.) The lease, not the
status column, answers "is a lap in flight", as it always did for the claim
and the sweeper.
"""

from __future__ import annotations

from typing import Final, cast

from sqlalchemy import ColumnElement, Table, and_, case, literal, or_

from agent_worker.core.vocabulary import RUNNABLE, RunStatus
from agent_worker.store.models import Run

# Not ``store.rows.runs``: ``store.rows`` builds every ``RunRecord`` with ``shown``.
runs = cast(Table, Run.__table__)

#: What the claim stores, and a continuing lap's commit keeps for a run the
#: reader sees ``queued``: started, not paused or ended.
STARTED: Final[RunStatus] = "running"


def in_flight() -> ColumnElement[bool]:
    """A lap of the run holds a lease (live or lapsed): shown ``running``.
    Only a stored ``running`` (every claim writes it), so counting laps in
    flight reads no row of a backlog of never-claimed ``queued`` runs."""
    return and_(runs.c.status == STARTED, runs.c.lease_owner.is_not(None))


def waiting_turn() -> ColumnElement[bool]:
    """Runnable and nobody holds it: shown ``queued`` (a lap is due or sent)."""
    return and_(runs.c.status.in_(RUNNABLE), runs.c.lease_owner.is_(None))


def status_is(status: str) -> ColumnElement[bool]:
    """The SQL condition "the run is shown with ``status``" (both runnable
    statuses stay an index range on ``status``, then a filter on the lease)."""
    if status == "running":
        return in_flight()
    if status == "queued":
        return waiting_turn()
    return runs.c.status == status


def shown_column() -> ColumnElement[str]:
    """The shown status as a SQL expression (for counts grouped by status)."""
    return case(
        (in_flight(), literal("running")),
        (runs.c.status == STARTED, literal("queued")),
        else_=runs.c.status,
    )


def shown(status: RunStatus, lease_owner: str | None) -> RunStatus:
    """The shown status of a stored row (``RunRecord.status``)."""
    if status == STARTED:
        return "queued" if lease_owner is None else "running"
    return status


def stored(status: RunStatus) -> RunStatus:
    """What a lap commit stores for the status it means: a run it hands to its
    next lap (``queued``) keeps ``running``, so the commit changes no indexed
    column (its cleared lease makes it shown ``queued``)."""
    return STARTED if status == "queued" else status


def any_of(statuses: tuple[str, ...]) -> ColumnElement[bool]:
    """``status_is`` for any of ``statuses``."""
    return or_(*(status_is(s) for s in statuses))


__all__ = ["STARTED", "any_of", "in_flight", "shown", "shown_column", "status_is",
           "stored", "waiting_turn"]
