"""What the metrics rollup's triggers would have written for the rows the seed
copies (``bench.seed``), computed while the rows stream by.

Migration ``0017_metrics_rollup``'s insert trigger on ``runs`` appends a delta
row for every settled run a ``COPY`` inserts: at 1.1 M runs that is a trigger
call and a delta row per run during the load, and then a first metrics scrape
that folds 1.1 M deltas (100 batches of ``store.rollup.FOLD_BATCH``, well past
any scrape timeout) before the database looks like one that grew by itself.
The seed disables the trigger for its transaction and writes ``run_totals``
from this instead: the same sums the deltas would have folded into.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from store.rollup import SETTLED, SUMS

#: The trigger a ``COPY`` into ``runs`` fires (its update and delete twins
#: never fire during a load).
TRIGGER = "run_totals_insert"
_COLUMNS = ("agent_name", "status", "runs", *SUMS)


class RunTotals:
    """Per (agent, status) of the settled runs seen: the run count and the
    sums of ``store.rollup.SUMS``, as a fold of the trigger's deltas holds them."""

    def __init__(self, run_columns: str) -> None:
        names = [c.strip() for c in run_columns.split(",")]
        self._agent, self._status = names.index("agent_name"), names.index("status")
        self._sums = [names.index(c) for c in SUMS]
        self.totals: dict[tuple[str, str], list[int]] = {}

    def add(self, row: Sequence[Any]) -> None:
        """Count one run row (a tuple in the order of ``run_columns``)."""
        status = row[self._status]
        if status not in SETTLED:
            return  # live runs are counted from their rows, never rolled up
        acc = self.totals.setdefault((row[self._agent], status), [0] * (1 + len(SUMS)))
        acc[0] += 1
        for i, column in enumerate(self._sums, start=1):
            acc[i] += int(row[column])

    def write(self, cur: psycopg.Cursor[Any]) -> int:
        """Insert the totals into the (empty) ``run_totals``; rows written."""
        with cur.copy(f"COPY run_totals ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
            for (agent, status), sums in sorted(self.totals.items()):
                copy.write_row((agent, status, *sums))
        return len(self.totals)


__all__ = ["TRIGGER", "RunTotals"]
