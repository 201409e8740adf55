"""Lap overhead with Postgres row-level security on and off, side by side (issue 16).

The same in-process runs as ``bench.run --only overhead`` (the shared workload,
``InProcessWorker`` on a fresh Postgres database), alternating between the
schema as migrated (RLS enabled and forced on every tenant-owned table) and the
same schema with RLS disabled, so both modes see the same machine load. Laps
run in the system scope (``store.tenancy``), as workers do: what is measured is
the policies' evaluation on every statement of the lap, not a set_config.

    python -m bench.rls [--laps 20] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime

import psycopg

from bench.common import RESULTS, create_database, drop_database, libpq_url, log
from bench.ours import InProcess
from bench.workload import run_id

TABLES = ("runs", "checkpoints", "messages", "effects", "events", "approvals", "signals",
          "audit_log")


def set_rls(url: str, on: bool) -> None:
    """Enable (and force) or disable row-level security on every tenant-owned table."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for t in TABLES:
            if on:
                conn.execute(f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY")
                conn.execute(f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY")
            else:
                conn.execute(f"ALTER TABLE {t} NO FORCE ROW LEVEL SECURITY")
                conn.execute(f"ALTER TABLE {t} DISABLE ROW LEVEL SECURITY")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--laps", type=int, default=20, help="laps per run")
    p.add_argument("--repeats", type=int, default=30, help="runs per mode")
    args = p.parse_args(argv)
    name = f"aw_bench_rls_{int(time.time())}"
    url = create_database(name)
    system = None
    try:
        system = InProcess(url.replace("postgresql://", "postgresql+psycopg://", 1))
        per_lap: dict[str, list[float]] = {"rls_on": [], "rls_off": []}
        for i in range(args.repeats):
            # Alternate which mode goes first, so a drift in load favours neither.
            for mode in (("rls_on", "rls_off") if i % 2 == 0 else ("rls_off", "rls_on")):
                set_rls(url, mode == "rls_on")
                seconds = system.run(run_id(f"rls-{mode}-{i}", args.laps, i), args.laps)
                per_lap[mode].append(seconds * 1e3 / args.laps)
                log(f"{mode} run {i}: {per_lap[mode][-1]:.3f} ms/lap")
        set_rls(url, True)
        med = {m: statistics.median(v) for m, v in per_lap.items()}
        # Each repeat runs the two modes back to back: the ratio within a pair
        # cancels most of a drift in the machine's load.
        paired = statistics.median(on / off for on, off in zip(per_lap["rls_on"],
                                                                  per_lap["rls_off"],
                                                                  strict=True))
        best = {m: min(v) for m, v in per_lap.items()}
        # The fastest run of each mode is the one the machine's load disturbed least.
        result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "laps": args.laps,
                  "repeats": args.repeats, "load_average": list(os.getloadavg()),
                  "ms_per_lap": per_lap, "median_ms_per_lap": med, "min_ms_per_lap": best,
                  "overhead_pct_paired": 100 * (paired - 1),
                  "overhead_pct_median": 100 * (med["rls_on"] / med["rls_off"] - 1),
                  "overhead_pct_min": 100 * (best["rls_on"] / best["rls_off"] - 1)}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "rls.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if system is not None:
            system.close()
        drop_database(name)


if __name__ == "__main__":
    raise SystemExit(main())
