"""One run at a time on 1 and then 2 worker processes (issue 21 goals 2 and 5):
``python -m bench.bounce``.

With two idle workers blocked in BRPOP on a run's lap queue, Redis hands the
next lap to the one that has waited longest, i.e. the other worker: every lap
then misses the lap cache (``store.lapcache``) and its claim reads the
checkpoint and the message window back from Postgres. The same happens at
random on a busy fleet. This prints the wall time and the workers' CPU per
lap (``/proc``, main processes and children) of one ``--laps``-lap run at a
time, the process counts taking turns ``--repeats`` times, so what a cache
miss costs shows as the gap between the two rows. Workers run the variant's
pool (``--variant``, one of ``bench.handoff``'s) at concurrency 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.common import RESULTS
from bench.fleets import BenchFleet
from bench.handoff import VARIANTS
from bench.ours import _run_celery
from bench.workload import run_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bounce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--laps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", default="solo-noevents", choices=sorted(VARIANTS))
    a = p.parse_args(argv)
    logdir = RESULTS / "logs" / f"bounce-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    fleet = BenchFleet("bounce", VARIANTS[a.variant], logdir)
    wall: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    try:
        for rep in range(a.repeats):
            for k in (1, 2):
                for _ in range(k):
                    fleet.worker(1)
                _run_celery(fleet.aw, fleet.deferred, run_id(f"w{k}r{rep}", 5, 0), 5, 120)
                before = sum(fleet.cpu())
                seconds = _run_celery(fleet.aw, fleet.deferred, run_id(f"b{k}r{rep}", a.laps, 0),
                                      a.laps, 120 + a.laps / 10)
                cpu[k].append((sum(fleet.cpu()) - before) / a.laps * 1e3)
                wall[k].append(seconds / a.laps * 1e3)
                fleet.stop_workers()
    finally:
        fleet.close()
    print(f"load average before {load}, after {os.getloadavg()}; {a.variant}, "
          f"{a.repeats} runs of {a.laps} laps per row")
    print("| workers | ms/lap (min-max) | workers' CPU ms/lap (min-max) |")
    print("|---|---|---|")
    for k in (1, 2):
        print(f"| {k} | {statistics.median(wall[k]):.2f} ({min(wall[k]):.2f}-{max(wall[k]):.2f})"
              f" | {statistics.median(cpu[k]):.2f} ({min(cpu[k]):.2f}-{max(cpu[k]):.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
