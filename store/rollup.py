"""Run totals by agent and status at a cost that does not grow with the run table.

The metrics scrape needs, per agent and status, how many runs there are and
the sums of their cost, tokens and recoveries. Grouping the run table did
that in 2.9 s at 1.11 M runs (BENCHMARKS.md). Here the answer is three parts,
read in one statement (so one snapshot: a run moving between parts at that
moment is counted once):

* **live runs** (``queued``, ``running``): a few, counted from their rows
  through the status indexes, with the stale count;
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

What the totals mean: the runs present in the table. Retention never deletes a
run row (it prunes checkpoints, messages, the ledger and events), so for
counters (cost, tokens, recoveries) that is every run ever started; only a
manual ``DELETE FROM runs`` would lower them, and then they stay equal to the
table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Row,
    Select,
    Table,
    delete,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite

from agent_worker.vocabulary import RUN_STATUSES, RUNNABLE, RunStatus
from store.rollupmodels import RunTotalDeltaRow, RunTotalsRow
from store.rows import runs
from store.runstatus import shown_column

run_totals = cast(Table, RunTotalsRow.__table__)
run_total_deltas = cast(Table, RunTotalDeltaRow.__table__)

#: Statuses kept in ``run_totals`` (the triggers name the complement, RUNNABLE).
SETTLED: tuple[RunStatus, ...] = tuple(s for s in RUN_STATUSES if s not in RUNNABLE)
#: The columns summed per (agent, status), after the run count.
SUMS = ("cost_micros", "input_tokens", "output_tokens", "recoveries")
#: Key of the advisory lock one folder holds for its transaction.
FOLD_LOCK = 0x61777466  # "awtf"
#: Deltas folded per transaction: a backlog (no scrape for days) is folded in
#: steps that each hold their locks briefly.
FOLD_BATCH = 10_000


def totals_query(*, stale_before: datetime) -> Select[Any]:
    """One row per (agent, status) part: ``agent_name, status, runs,
    cost_micros, input_tokens, output_tokens, recoveries, stale``; a pair may
    appear up to three times (live rows, folded totals, deltas): add them up.

    A run is stale when it should be moving (queued or running) but its last
    checkpoint is older than ``stale_before`` (``list_runs(stale=True)``).
    """
    shown = shown_column().label("status")  # a stored ``running`` between laps is ``queued``
    live = (select(runs.c.agent_name, shown, func.count().label("runs"),
                   *[func.coalesce(func.sum(runs.c[c]), 0).label(c) for c in SUMS],
                   func.count().filter(runs.c.last_checkpoint_at < stale_before).label("stale"))
            .where(runs.c.status.in_(RUNNABLE))
            .group_by(runs.c.agent_name, shown))
    folded = select(run_totals.c.agent_name, run_totals.c.status, run_totals.c.runs,
                    *[run_totals.c[c] for c in SUMS], literal(0).label("stale"))
    deltas = (select(run_total_deltas.c.agent_name, run_total_deltas.c.status,
                     func.sum(run_total_deltas.c.runs).label("runs"),
                     *[func.sum(run_total_deltas.c[c]).label(c) for c in SUMS],
                     literal(0).label("stale"))
              .group_by(run_total_deltas.c.agent_name, run_total_deltas.c.status))
    parts = union_all(live, folded, deltas).subquery()
    return select(parts.c.agent_name, parts.c.status,
                  *[func.sum(parts.c[c]).label(c) for c in ("runs", *SUMS, "stale")]
                  ).group_by(parts.c.agent_name, parts.c.status)


def read_totals(conn: Connection, *, stale_before: datetime) -> Sequence[Row[Any]]:
    """The rows of ``totals_query``, summed per (agent, status)."""
    return conn.execute(totals_query(stale_before=stale_before)).all()


def fold(conn: Connection, *, batch: int = FOLD_BATCH) -> int:
    """Move up to ``batch`` deltas into ``run_totals`` inside the caller's
    transaction (which commits them together); returns how many moved, 0 when
    another folder holds the lock. Call again while it returns ``batch``."""
    postgres = conn.dialect.name == "postgresql"
    if postgres and not conn.execute(
            select(func.pg_try_advisory_xact_lock(FOLD_LOCK))).scalar_one():
        return 0
    oldest = select(run_total_deltas.c.id).order_by(run_total_deltas.c.id).limit(batch)
    moved = conn.execute(
        delete(run_total_deltas).where(run_total_deltas.c.id.in_(oldest))
        .returning(run_total_deltas.c.agent_name, run_total_deltas.c.status,
                   run_total_deltas.c.runs, *[run_total_deltas.c[c] for c in SUMS])).all()
    if not moved:
        return 0
    sums: dict[tuple[str, str], list[int]] = {}
    for r in moved:
        acc = sums.setdefault((r.agent_name, r.status), [0] * (1 + len(SUMS)))
        for i, c in enumerate(("runs", *SUMS)):
            acc[i] += int(r._mapping[c])
    rows = [{"agent_name": a, "status": s, **dict(zip(("runs", *SUMS), v, strict=True))}
            for (a, s), v in sorted(sums.items())]
    stmt = (postgresql.insert(run_totals) if postgres else sqlite.insert(run_totals)).values(rows)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[run_totals.c.agent_name, run_totals.c.status],
        set_={c: run_totals.c[c] + stmt.excluded[c] for c in ("runs", *SUMS)}))
    return len(moved)


def unfolded(conn: Connection) -> int:
    """How many deltas wait for a fold (tests and the bench read it)."""
    return int(conn.execute(select(func.count()).select_from(run_total_deltas)).scalar_one())


__all__ = ["FOLD_BATCH", "SETTLED", "SUMS", "fold", "read_totals", "run_total_deltas",
           "run_totals", "totals_query", "unfolded"]
