"""Private memory of prefork pool children with the worker's collector as
``tasks.garbage`` sets it and as Python leaves it, paired (BENCHMARKS.md
goal 3, memory): ``python -m bench.prefork_memory``.

A forked child shares its parent's pages until it writes to them, and a
full collection writes to every object it walks (its reference-count
bookkeeping), so each child's first full collection copies the parent's heap
page by page. ``tasks.garbage`` freezes that heap before the pool forks, so
no collection walks it. Per variant (``AGENT_WORKER_WORKER_GC_THRESHOLD`` at
its default, and 0): one prefork worker of ``--concurrency`` children, task
events off, runs ``--bursts`` bursts of ``bench.scaling``'s instant-lap runs
(``--runs`` runs of ``--laps`` laps sent at once), then each child's private
memory (``Private_Clean + Private_Dirty`` of ``/proc/<pid>/smaps_rollup``:
what it does not share) and proportional share (``Pss``). The variants take
turns ``--repeats`` times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.common import RESULTS
from bench.fleets import BenchFleet
from bench.gc_worker import VARIANTS, turns
from bench.scaling import rate


def memory_mb(pid: int) -> dict[str, int]:
    """``Pss`` and private memory of ``pid`` in MB."""
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Pss", "Private_Clean", "Private_Dirty"):
            kb[key] = int(value.split()[0])
    return {"pss": kb["Pss"] // 1024,
            "private": (kb["Private_Clean"] + kb["Private_Dirty"]) // 1024}


def measure(variant: dict[str, str], args: argparse.Namespace, logdir: Path,
            turn: int) -> dict[str, list[int]]:
    env = {"AGENT_WORKER_WORKER_POOL": "prefork", "AGENT_WORKER_TASK_EVENTS": "false", **variant}
    fleet = BenchFleet(f"prefork_memory_{turn}", env, logdir)
    try:
        fleet.worker(args.concurrency)
        for burst in range(args.bursts):
            rate(fleet, args.runs, args.laps, f"pm{turn}-{burst}")
        _, children = fleet.pids()
        found = [memory_mb(pid) for pid in children]
    finally:
        fleet.close()
    return {"private": sorted(m["private"] for m in found), "pss": sorted(m["pss"] for m in found)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prefork_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4, help="pool children")
    p.add_argument("--bursts", type=int, default=6)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--laps", type=int, default=50)
    args = p.parse_args(argv)
    logdir = RESULTS / "logs" / f"prefork_memory-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    found: dict[str, list[dict[str, list[int]]]] = {name: [] for name in VARIANTS}
    for turn, (name, variant) in enumerate(turns(args.repeats)):
        found[name].append(measure(variant, args, logdir, turn))
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}")
    print(f"prefork, {args.concurrency} children, {args.bursts} bursts of {args.runs} runs x "
          f"{args.laps} laps; per child, every child of every repeat")
    print("| worker collector | private MB per child: median (each) | Pss MB per child: median |")
    print("|---|---|---|")
    for name, runs in found.items():
        private = [mb for r in runs for mb in r["private"]]
        pss = [mb for r in runs for mb in r["pss"]]
        print(f"| {name} | {statistics.median(private):.0f} ({', '.join(map(str, private))}) "
              f"| {statistics.median(pss):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
