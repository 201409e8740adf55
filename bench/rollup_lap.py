"""What the run-total triggers (migration ``0017_metrics_rollup``) cost a lap:
the in-process lap of ``bench.ours`` on two fresh databases at the same
schema, one with the triggers dropped, runs alternating between them.

    python -m bench.rollup_lap --sizes 10,50 --repeats 7

A lap of a running run matches no trigger's ``WHEN`` (Postgres queues
nothing); the lap that ends a run appends one delta row. So the ratio should
be 1 within the machine's noise for short and long runs alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import UTC, datetime
from typing import Any

import psycopg

from agent_worker.store.migrate import upgrade
from bench.common import System, create_database, drop_database, interleaved_runs, libpq_url
from bench.ours import InProcess

TRIGGERS = ("run_totals_insert", "run_totals_update", "run_totals_delete")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,50", help="laps per run, comma-separated")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    names = {label: f"aw_rollup_{label}_{os.getpid()}" for label in ("triggers", "none")}
    urls = {label: create_database(name) for label, name in names.items()}
    try:
        for url in urls.values():
            upgrade(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with psycopg.connect(libpq_url(urls["none"]), autocommit=True) as conn:
            for t in TRIGGERS:
                conn.execute(f"DROP TRIGGER {t} ON runs")
        systems: list[System] = []
        for label, url in urls.items():
            ours = InProcess(url)
            ours.name = label
            systems.append(ours)
        errors: dict[str, str] = {}
        sizes = [int(n) for n in a.sizes.split(",")]
        out: dict[str, Any] = {"load": os.getloadavg(), "at": datetime.now(UTC).isoformat()}
        laps = interleaved_runs(systems, sizes, a.repeats, f"rollup{os.getpid()}", errors)
        for done in systems:
            done.close()
        for n in sizes:
            cell = {k: laps[k][str(n)] for k in ("triggers", "none")}
            t, none = (cell[k]["ms_per_lap"]["median"] for k in ("triggers", "none"))
            paired = statistics.median(
                x / y for x, y in zip(cell["triggers"]["ms_per_lap_samples"],
                                      cell["none"]["ms_per_lap_samples"], strict=True))
            out[str(n)] = {"triggers_ms": round(t, 3), "none_ms": round(none, 3),
                           "ratio_of_medians": round(t / none, 3),
                           "ratio_paired": round(paired, 3),
                           "wal_b_per_lap_median": {k: round(v["wal_bytes_per_lap"]["median"])
                                                    for k, v in cell.items()}}
        out.update(errors=errors, load_after=os.getloadavg())
        print(json.dumps(out, indent=1, default=str))
    finally:
        for name in names.values():
            drop_database(name)


if __name__ == "__main__":
    main()
