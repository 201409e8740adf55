"""The scrape's run totals, before and after ``0017_metrics_rollup``, side by
side on one seeded database (``bench.seed``, then ``agent-worker db upgrade``):
the full aggregation the scrape used to run (every run row grouped by agent
and status) against ``store.rollup.read_totals``, alternating sample by
sample, and what a fold costs after ``--end`` runs have ended since the last.

    python -m bench.scrape_totals --db aw_scale_metrics --samples 15 --end 1000

Both readings are checked equal. The ended runs are queued or running runs set
to succeeded in one transaction (as laps would, one by one) and set back
afterwards, so the database is left as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, select, text

from agent_worker.store import rollup, stats
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from bench.common import PG_ADMIN, sa_url


def full(conn: Connection) -> dict[tuple[str, str], tuple[int, ...]]:
    """The scrape's aggregation before the rollup (store.stats at 0015)."""
    rows = conn.execute(select(
        runs.c.agent_name, runs.c.status, func.count(),
        *[func.coalesce(func.sum(runs.c[c]), 0) for c in rollup.SUMS])
        .group_by(runs.c.agent_name, runs.c.status)).all()
    return {(r[0], r[1]): tuple(int(v) for v in r[2:]) for r in rows}


def rolled(conn: Connection) -> dict[tuple[str, str], tuple[int, ...]]:
    rows = rollup.read_totals(conn, stale_before=datetime.now(UTC))
    out = {(r.agent_name, r.status): (r.runs, *(int(getattr(r, c)) for c in rollup.SUMS))
           for r in rows}
    return {k: v for k, v in out.items() if any(v)}


def timed(store: SqlStore, fn: Callable[[Connection], object]) -> float:
    with store.engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL jit = off")
        t0 = time.perf_counter()
        fn(conn)
        return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="aw_scale_metrics")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--end", type=int, default=1000, help="runs ended before the fold")
    a = ap.parse_args()
    store = SqlStore(sa_url(PG_ADMIN.rsplit("/", 1)[0] + "/" + a.db))
    out: dict[str, Any] = {"load": os.getloadavg(), "at": datetime.now(UTC).isoformat()}
    stats.refresh(store)
    with store.engine.connect() as conn:
        assert full(conn) == rolled(conn), "the rollup disagrees with the run table"
    times: dict[str, list[float]] = {"full_aggregation": [], "rollup": []}
    for i in range(a.samples):
        order = [("full_aggregation", full), ("rollup", rolled)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            times[name].append(timed(store, fn))
    out["ms"] = {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                     "max": round(max(v), 2)} for k, v in times.items()}
    ended = (f"SELECT id, status FROM runs WHERE status IN ('queued', 'running') "
             f"ORDER BY id LIMIT {int(a.end)}")
    with store.engine.begin() as conn:
        before = conn.execute(text(ended)).all()
        conn.execute(text("UPDATE runs SET status = 'succeeded' WHERE id = ANY(:ids)"),
                     {"ids": [r.id for r in before]})
    with store.engine.connect() as conn:
        out["unfolded_after_end"] = rollup.unfolded(conn)
        out["read_with_unfolded_ms"] = round(timed(store, rolled), 2)
    t0 = time.perf_counter()
    out["folded"] = stats.refresh(store)
    out["fold_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    with store.engine.connect() as conn:
        out["equal_after_fold"] = full(conn) == rolled(conn)
    with store.engine.begin() as conn:  # put the runs back as they were
        for status in ("queued", "running"):
            conn.execute(text("UPDATE runs SET status = :s WHERE id = ANY(:ids)"),
                         {"s": status, "ids": [r.id for r in before if r.status == status]})
    stats.refresh(store)
    with store.engine.connect() as conn:
        out["equal_after_restore"] = full(conn) == rolled(conn)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    store.dispose()


if __name__ == "__main__":
    main()
