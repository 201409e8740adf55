"""Run and approval totals at a cost that does not grow with either table.

The metrics scrape needs, per agent and status, how many runs there are and
the sums of their cost, tokens and recoveries. Grouping the run table did
that in 2.9 s at 1.11 M runs (BENCHMARKS.md). Here the answer is three parts,
read in one statement (so one snapshot: a run moving between parts at that
moment is counted once):

* **live runs** (``queued``, ``running``): a few, counted from their rows
  through the status indexes, grouped finely enough (``store.census``) that
  the stale count, the fair-share lines and the unserved runs are summed from
  the same read;
* **settled runs** (every other status): ``run_totals``, as of the last fold,
* plus the **deltas** not folded yet: rows the triggers of migration
  ``0017_metrics_rollup`` append when a run enters (+1 and its sums), leaves
  (-1 and its old sums) or changes within a settled status.

The sum is exact at the statement's snapshot, whether or not anyone folded:
folding only keeps the delta table short. ``fold`` moves deltas into
``run_totals`` with ``DELETE ... RETURNING`` and an upsert in one transaction,
so a delta row is folded exactly once: a row whose transaction commits after a
fold began is invisible to that fold's DELETE and is folded by the next (no
watermark that a late commit could fall behind), and two folders cannot both
delete a row. An advisory lock makes a second concurrent folder skip rather
than queue behind the first.

Pending approvals are counted the same way (migration
``0020_approval_totals``): ``approval_totals`` per status plus the unfolded
``approval_total_deltas``, folded by the same ``fold`` in the same
transaction under the same lock; their count reads no approval row, and the
oldest pending request is the first entry of ``ix_approvals_pending``.

What the totals mean: the runs present in the table. Retention never deletes a
run row (it prunes checkpoints, messages, the ledger and events), so for
counters (cost, tokens, recoveries) that is every run ever started; only a
manual ``DELETE FROM runs`` would lower them, and then they stay equal to the
table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, NamedTuple, cast

from sqlalchemy import CompoundSelect, Connection, Select, Table, delete, func, select, union_all
from sqlalchemy.dialects import postgresql, sqlite

from agent_worker.core.vocabulary import RUN_STATUSES, RUNNABLE, RunStatus
from agent_worker.store.census import STALE_BEFORE, SUMS, LiveGroup, live_select, settled_columns
from agent_worker.store.rollupmodels import (
    ApprovalTotalDeltaRow,
    ApprovalTotalsRow,
    RunTotalDeltaRow,
    RunTotalsRow,
)
from agent_worker.store.rows import approvals

run_totals = cast(Table, RunTotalsRow.__table__)
run_total_deltas = cast(Table, RunTotalDeltaRow.__table__)
approval_totals = cast(Table, ApprovalTotalsRow.__table__)
approval_total_deltas = cast(Table, ApprovalTotalDeltaRow.__table__)

#: Statuses kept in ``run_totals`` (the triggers name the complement, RUNNABLE).
SETTLED: tuple[RunStatus, ...] = tuple(s for s in RUN_STATUSES if s not in RUNNABLE)
#: Key of the advisory lock one folder holds for its transaction.
FOLD_LOCK = 0x61777466  # "awtf"
#: Deltas folded per transaction and rollup: a backlog (no scrape for days) is
#: folded in steps that each hold their locks briefly.
FOLD_BATCH = 10_000


@dataclass(frozen=True)
class Rollup:
    """Totals that triggers keep by appending deltas: ``deltas`` has the
    columns of ``totals``, keyed by ``keys``; ``count`` (1 or -1 per row the
    trigger saw) and ``sums`` are added up per key."""

    totals: Table
    deltas: Table
    keys: tuple[str, ...]
    count: str
    sums: tuple[str, ...] = ()
    #: The rows the triggers count, by status (``None``: every row).
    statuses: tuple[str, ...] | None = None

    @property
    def added(self) -> tuple[str, ...]:
        return (self.count, *self.sums)


#: Settled runs per (agent, status): migration 0017_metrics_rollup.
RUNS = Rollup(run_totals, run_total_deltas, ("agent_name", "status"), "runs", SUMS, SETTLED)
#: Approvals per status: migration 0020_approval_totals.
APPROVALS = Rollup(approval_totals, approval_total_deltas, ("status",), "approvals")
ROLLUPS = (RUNS, APPROVALS)


#: The fields of ``Totals`` after the key, summed from every part.
_TOTALLED = ("runs", *SUMS, "stale")


class Totals(NamedTuple):
    """The runs of one agent in one (shown) status, and their sums."""

    agent_name: str
    status: str
    runs: int
    cost_micros: int
    input_tokens: int
    output_tokens: int
    recoveries: int
    stale: int


@dataclass(frozen=True)
class Figures:
    """One read of every run figure a scrape exports (``read_figures``)."""

    #: Per (agent, status), every run: live and settled.
    totals: list[Totals]
    #: The live runs in ``store.census`` groups (fair-share lines, unserved).
    live: list[LiveGroup]


@cache
def totals_query() -> CompoundSelect[Any]:
    """The live groups of ``store.census`` (``live = 1``), then the folded
    totals and the unfolded deltas per (agent, status) (``live = 0``), in the
    columns of ``census.live_select``; one (agent, status) may appear in
    several rows: add them up (``read_figures``). Takes the parameter
    ``census.STALE_BEFORE``: a run is stale when it should be moving (queued
    or running) but its last checkpoint is older (``list_runs(stale=True)``).
    Built once (``cache``): a statement executed again skips building it and
    its cache key.
    """
    t, d = run_totals.c, run_total_deltas.c
    folded = select(*settled_columns(
        t.agent_name, t.status, [t.runs.label("runs"), *[t[c].label(c) for c in SUMS]]))
    deltas = (select(*settled_columns(
        d.agent_name, d.status,
        [func.sum(d.runs).label("runs"), *[func.sum(d[c]).label(c) for c in SUMS]]))
        .group_by(d.agent_name, d.status))
    return union_all(live_select(stale=True), folded, deltas)


def read_figures(conn: Connection, *, stale_before: datetime) -> Figures:
    """``totals_query``'s rows: the live groups as they are, and every part
    summed per (agent, status)."""
    live: list[LiveGroup] = []
    sums: dict[tuple[str, str], list[int]] = {}
    for row in conn.execute(totals_query(), {STALE_BEFORE: stale_before}):
        group = LiveGroup.of(row)
        if row.live:
            live.append(group)
        acc = sums.setdefault((group.agent_name, group.status), [0] * (2 + len(SUMS)))
        for i, c in enumerate(_TOTALLED):
            acc[i] += getattr(group, c)
    return Figures(totals=[Totals(a, s, *v) for (a, s), v in sorted(sums.items())], live=live)


def read_totals(conn: Connection, *, stale_before: datetime) -> list[Totals]:
    """Every run counted and summed per (agent, shown status)."""
    return read_figures(conn, stale_before=stale_before).totals


@cache
def pending_query() -> Select[Any]:
    """The pending approvals' count and oldest request, in one statement (one
    snapshot): the count from ``approval_totals`` plus the unfolded deltas,
    the oldest from the first entry of ``ix_approvals_pending``. The oldest is
    an explicit ``ORDER BY ... LIMIT 1``, not ``min()``: the tenancy policy's
    filter is estimated to pass almost no row, so for ``min()`` the planner
    may price reading every pending approval the same as stopping at the
    first, and take the plain aggregate (seen in CI)."""
    t, d = approval_totals.c, approval_total_deltas.c
    counted = [select(func.coalesce(func.sum(c.approvals), 0)).where(c.status == "pending")
               .scalar_subquery() for c in (t, d)]
    oldest = (select(approvals.c.requested_at).where(approvals.c.status == "pending")
              .order_by(approvals.c.requested_at).limit(1).scalar_subquery())
    return select((counted[0] + counted[1]).label("pending"), oldest.label("oldest"))


def fold(conn: Connection, *, batch: int = FOLD_BATCH) -> int:
    """Move up to ``batch`` deltas of each rollup into its totals inside the
    caller's transaction (which commits them together); returns how many
    moved in all, 0 when another folder holds the lock. Call again while it
    returns ``batch`` or more (then a rollup may have more waiting)."""
    postgres = conn.dialect.name == "postgresql"
    if postgres and not conn.execute(
            select(func.pg_try_advisory_xact_lock(FOLD_LOCK))).scalar_one():
        return 0
    return sum(_fold(conn, r, batch, postgres) for r in ROLLUPS)


def _fold(conn: Connection, rollup: Rollup, batch: int, postgres: bool) -> int:
    deltas = rollup.deltas
    oldest = select(deltas.c.id).order_by(deltas.c.id).limit(batch)
    moved = conn.execute(
        delete(deltas).where(deltas.c.id.in_(oldest))
        .returning(*[deltas.c[c] for c in (*rollup.keys, *rollup.added)])).all()
    if not moved:
        return 0
    sums: dict[tuple[Any, ...], list[int]] = {}
    for r in moved:
        acc = sums.setdefault(tuple(r[:len(rollup.keys)]), [0] * len(rollup.added))
        for i, value in enumerate(r[len(rollup.keys):]):
            acc[i] += int(value)
    rows = [dict(zip((*rollup.keys, *rollup.added), (*k, *v), strict=True))
            for k, v in sorted(sums.items())]
    totals = rollup.totals
    stmt = (postgresql.insert(totals) if postgres else sqlite.insert(totals)).values(rows)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[totals.c[k] for k in rollup.keys],
        set_={c: totals.c[c] + stmt.excluded[c] for c in rollup.added}))
    return len(moved)


def unfolded(conn: Connection, rollup: Rollup = RUNS) -> int:
    """How many deltas of ``rollup`` wait for a fold (tests and the bench read it)."""
    return int(conn.execute(select(func.count()).select_from(rollup.deltas)).scalar_one())


__all__ = ["APPROVALS", "FOLD_BATCH", "ROLLUPS", "RUNS", "SETTLED", "SUMS", "Figures",
           "Rollup", "Totals", "approval_total_deltas", "approval_totals", "fold",
           "pending_query", "read_figures", "read_totals", "run_total_deltas", "run_totals",
           "totals_query", "unfolded"]
