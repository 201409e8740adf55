"""Throughput of one worker from several source trees, paired (BENCHMARKS.md
goals 2 and 5): ``python -m bench.tree_throughput --trees /tmp/before,.``.

``bench.scaling``'s workload (runs of instant laps, all first laps sent in one
burst) on one worker process per tree, of ``deploy/``'s pool (threads, task
events on, unless ``--pool``/``--no-events`` say otherwise), the trees taking
turns burst by burst so load bursts on a shared machine hit them alike
(``--events-both``: each tree's worker twice, task events on and off, taking
turns the same way). Per worker: laps per second and the worker's CPU per
lap (``/proc``), medians and ranges over the repeats. What ``bench.handoff``
cannot show: one run at a time never queues laps behind each other, so the
consumer thread's share of the work (deliveries, acks, the task events'
flushes) is hidden there.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.common import RESULTS, spread
from bench.fleets import BenchFleet
from bench.scaling import rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tree_throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", required=True, help="comma-separated source trees")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--laps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pool", default="threads", help="AGENT_WORKER_WORKER_POOL")
    p.add_argument("--concurrency", type=int, default=8, help="laps at once per worker")
    event_flags = p.add_mutually_exclusive_group()
    event_flags.add_argument("--no-events", action="store_true", help="task events off")
    event_flags.add_argument("--events-both", action="store_true",
                             help="each tree twice, task events on and off, paired burst by burst")
    args = p.parse_args(argv)
    settings = [("on", "true"), ("off", "false")] if args.events_both else [
        ("off", "false") if args.no_events else ("on", "true")]
    workers = [(Path(t).resolve(), shown, value) for t in args.trees.split(",") if t
               for shown, value in settings]
    logdir = RESULTS / "logs" / f"tree-throughput-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    fleets: list[BenchFleet] = []
    rates: list[list[float]] = [[] for _ in workers]
    cpu: list[list[float]] = [[] for _ in workers]
    try:
        for i, (tree, _, events) in enumerate(workers):
            env = {"AGENT_WORKER_WORKER_POOL": args.pool, "AGENT_WORKER_TASK_EVENTS": events}
            fleets.append(BenchFleet(f"tree_tp_{i}", env, logdir, tree=tree))
            fleets[-1].worker(args.concurrency)
        for repeat in range(args.repeats):
            for i, fleet in enumerate(fleets):
                before = sum(fleet.cpu())
                rates[i].append(rate(fleet, args.runs, args.laps, f"tt{repeat}t{i}"))
                cpu[i].append((sum(fleet.cpu()) - before) / (args.runs * args.laps) * 1e3)
    finally:
        for fleet in fleets:
            fleet.close()
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}")
    print(f"{args.pool} x {args.concurrency}, "
          f"{args.runs} runs x {args.laps} laps a burst, {args.repeats} bursts per worker")
    print("| tree | task events | laps/s (min-max) | worker CPU µs/lap (min-max) |")
    print("|---|---|---|---|")
    for (tree, shown, _), r, c in zip(workers, rates, cpu, strict=True):
        print(f"| {tree} | {shown} | {spread(r)} | {spread([x * 1e3 for x in c])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
