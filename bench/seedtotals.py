"""What the metrics rollups' triggers would have written for the rows the seed
copies (``bench.seed``), computed while the rows stream by.

The insert triggers of migrations ``0017_metrics_rollup`` (on ``runs``) and
``0020_approval_totals`` (on ``approvals``) append a delta row for every row
a ``COPY`` inserts: at 1.1 M runs that is a trigger call and a delta row per
row during the load, and then a first metrics scrape that folds 1.1 M deltas
(100 batches of ``store.rollup.FOLD_BATCH``, well past any scrape timeout)
before the database looks like one that grew by itself. The seed disables
those triggers for its transaction and writes the totals from this instead:
the sums the deltas would have folded into.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from agent_worker.store.rollup import APPROVALS, RUNS, Rollup


@dataclass(frozen=True)
class Seeded:
    """A rollup fed by the rows of ``table``, through the insert trigger
    ``trigger`` (the only one of its triggers a load fires)."""

    rollup: Rollup
    table: str
    trigger: str


SEEDED = (Seeded(RUNS, "runs", "run_totals_insert"),
          Seeded(APPROVALS, "approvals", "approval_totals_insert"))


class Totals:
    """A fold of the deltas the trigger would have appended for the rows seen:
    per key, the row count and the sums of ``rollup.sums`` (source columns
    of the same names), over the rows whose status the trigger counts."""

    def __init__(self, seeded: Seeded, columns: str) -> None:
        self.seeded = seeded
        names = [c.strip() for c in columns.split(",")]
        rollup = seeded.rollup
        self._keys = [names.index(k) for k in rollup.keys]
        self._sums = [names.index(c) for c in rollup.sums]
        self._status = names.index("status")
        self.totals: dict[tuple[Any, ...], list[int]] = {}

    def add(self, row: Sequence[Any]) -> None:
        """Count one row (a tuple in the order of ``columns``)."""
        statuses = self.seeded.rollup.statuses
        if statuses is not None and row[self._status] not in statuses:
            return  # e.g. live runs: counted from their rows, never rolled up
        acc = self.totals.setdefault(tuple(row[i] for i in self._keys),
                                     [0] * (1 + len(self._sums)))
        acc[0] += 1
        for i, column in enumerate(self._sums, start=1):
            acc[i] += int(row[column])

    def write(self, cur: psycopg.Cursor[Any]) -> int:
        """Insert the totals into the (empty) totals table; rows written."""
        rollup = self.seeded.rollup
        columns = ", ".join((*rollup.keys, *rollup.added))
        with cur.copy(f"COPY {rollup.totals.name} ({columns}) FROM STDIN") as copy:
            for key, sums in sorted(self.totals.items()):
                copy.write_row((*key, *sums))
        return len(self.totals)


__all__ = ["SEEDED", "Seeded", "Totals"]
