"""Database-side faults at full length, through real Celery workers: the
figures behind BENCHMARKS.md "Database-side faults" (the chaos suite,
``tests/chaos/test_database_faults.py``, runs the same scenarios shorter).

* ``terminations``: every client backend of the fleet's database terminated
  every 5 s for ``--terminate-seconds`` (60);
* ``horizon``: a session idle in a transaction for ``--hold-seconds`` (300):
  the lap rate, and how much ``runs`` and ``effects`` grow while no dead row
  version can be removed, then what ``VACUUM`` leaves;
* ``pool``: a threads worker whose pool keeps one connection, with more laps
  than connections each waiting on a tool slower than the lease TTL, against
  the same load on a pool of 20.

Each on a fresh database of the shared Postgres and a Redis database of its
own (it terminates and holds only that database's sessions), with the default
timings (lease 10 s, sweep 2 s); every run is checked afterwards (no lap or
payment lost or doubled).

    python -m bench.dbfaults                       # all three, about 12 minutes
    python -m bench.dbfaults --scenario horizon --hold-seconds 60
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

# Registers chaos-mix in this process too (the client checks the agent it
# starts), as AGENT_WORKER_AGENT_MODULES does in the workers.
import tests.agents  # noqa: F401
from agent_worker.demo.vendor import start_vendor
from bench.common import Proc, celery_beat, log
from bench.dbfaultkit import (
    Fault,
    Feeder,
    HeldHorizon,
    Plan,
    Terminations,
    drive,
    lost_leases,
    pool_phases,
    verify,
)
from bench.fleets import BenchFleet

SCENARIOS = ("terminations", "horizon", "pool")


def _scenario(name: str, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    fleet = BenchFleet(f"dbfaults-{name}", {}, logdir, agent_modules="tests.agents")
    beat: Proc | None = None
    try:
        with start_vendor(logdir / f"{name}-vendor.db") as vendor:
            env = {"AGENT_WORKER_VENDOR_URL": vendor.url}
            beat = celery_beat(fleet.env, logdir / f"{name}-beat.log")
            if name == "pool":
                def worker(pool: str) -> Proc:
                    return fleet.worker(args.pool_concurrency, AGENT_WORKER_WORKER_POOL="threads",
                                        AGENT_WORKER_WORKER_DB_POOL_SIZE=pool, **env)

                phases = pool_phases(fleet.url, fleet.aw.start_run, worker,
                                     concurrency=args.pool_concurrency, seconds=args.baseline,
                                     pause=args.slow_tool_seconds, log=log)
                figures: dict[str, Any] = {"phases": phases}
                problems = [p for f in phases.values()
                            for p in verify(fleet.url, f["prefix"], logdir / f"{name}-vendor.db")]
            else:
                for _ in range(args.workers):
                    fleet.worker(args.concurrency, **env)
                fault: Fault = (Terminations(fleet.url, every=5.0) if name == "terminations"
                                else HeldHorizon(fleet.url))
                seconds = args.terminate_seconds if name == "terminations" else args.hold_seconds
                prefix = f"dbf-{name}-"
                feeder = Feeder(fleet.aw.start_run, prefix,
                                args.workers * args.concurrency + 2, pause=args.pause)
                figures = drive(fleet.url, feeder, fault,
                                Plan(baseline=args.baseline, fault=seconds), log)
                figures.update(lost_leases(fleet.url, prefix))
                problems = verify(fleet.url, prefix, logdir / f"{name}-vendor.db")
        figures["problems"] = problems
        return figures
    finally:
        if beat is not None:
            beat.stop()
        fleet.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    p.add_argument("--terminate-seconds", type=float, default=60.0)
    p.add_argument("--hold-seconds", type=float, default=300.0)
    p.add_argument("--baseline", type=float, default=30.0,
                   help="seconds of load measured before a fault (and per pool phase)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.5, help="seconds a read lap's tool sleeps")
    p.add_argument("--pool-concurrency", type=int, default=16)
    p.add_argument("--slow-tool-seconds", type=float, default=12.0,
                   help="the pool scenario's read tool: longer than the lease TTL (10 s)")
    p.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = p.parse_args(argv)
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aw-dbfaults-") as tmp:
        for name in chosen:
            log(f"{name} ...")
            results[name] = _scenario(name, args, Path(tmp))
            print(json.dumps({name: results[name]}, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    failed = [n for n, r in results.items() if r["problems"]]
    if failed:
        raise SystemExit(f"invariants broken in: {', '.join(failed)}")


if __name__ == "__main__":
    main()
