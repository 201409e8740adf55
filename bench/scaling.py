"""Throughput from 1 to 2 worker processes: ``python -m bench.scaling``.

The workload of ``bench.run``'s throughput phase (runs of instant laps, all
first laps sent in one burst) on each fleet variant with 1 and then 2
processes, and LangGraph's ``PostgresSaver`` spread over 1 and 2 processes in
the same invocation. Repeat by repeat, every system runs with 1 and then 2
processes, so load bursts on a shared machine hit both counts alike; besides
the ratio of the medians, each system's 2-vs-1 ratio paired by repeat is given.

Variants: ``prefork`` is what ``bench.run`` measures (one worker whose main
process feeds k pool children: every lap's broker work stays in that one main
process); ``prefork-workers``, ``threads`` and ``solo`` run k worker
processes, each with its own consumer (``solo``: the lap runs in the
consumer's own thread, no pool at all). Prints laps/s and the 2-vs-1 ratio
of each; writes ``bench/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import RESULTS, create_database, drop_database, log, summary, wait_for
from bench.fleets import BenchFleet
from bench.ours import _finished, _run_celery, _span, start
from bench.workload import run_id

VARIANTS: dict[str, dict[str, str]] = {
    "prefork": {"AGENT_WORKER_WORKER_POOL": "prefork"},
    "prefork-workers": {"AGENT_WORKER_WORKER_POOL": "prefork"},
    "threads": {"AGENT_WORKER_WORKER_POOL": "threads"},
    "threads-noevents": {"AGENT_WORKER_WORKER_POOL": "threads",
                         "AGENT_WORKER_TASK_EVENTS": "false"},
    "solo-noevents": {"AGENT_WORKER_WORKER_POOL": "solo",
                      "AGENT_WORKER_TASK_EVENTS": "false"},
}


def _start_processes(fleet: BenchFleet, variant: str, k: int, threads: int) -> None:
    if variant == "prefork":
        fleet.worker(k)  # one main process, k pool children
    else:
        for _ in range(k):
            fleet.worker(threads if variant.startswith("threads") else 1)


def rate(fleet: BenchFleet, runs: int, laps: int, prefix: str) -> float:
    """Laps per second of ``runs`` runs of ``laps`` laps sent in one burst."""
    rids = [run_id(prefix, laps, i) for i in range(runs)]
    for rid in rids:
        start(fleet.aw, rid)
    fleet.deferred.flush()
    wait_for(partial(_finished, fleet.store, rids), 120 + runs * laps / 5,
             what=f"{runs} runs on {fleet.name}", interval=0.5)
    count, seconds = _span(fleet.store, rids)
    if count != runs * laps:
        raise RuntimeError(f"expected {runs * laps} laps, counted {count}")
    return count / seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--laps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=8, help="threads per threads worker")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--no-langgraph", action="store_true")
    args = p.parse_args(argv)
    logdir = RESULTS / "logs" / f"scaling-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    names = args.variants.split(",")
    samples: dict[str, dict[int, list[float]]] = {name: {1: [], 2: []} for name in names}
    fleets = {name: BenchFleet(f"scaling_{name}", VARIANTS[name], logdir) for name in names}
    lg: Any = None
    lg_db = "bench_scaling_langgraph"
    if not args.no_langgraph:
        from bench import langgraph_bench as lg

        lg_url = create_database(lg_db)
        lg.setup(lg_url)
        samples["langgraph"] = {1: [], 2: []}
    try:
        # Repeat by repeat, 1 and then 2 processes of every system: a burst of
        # load on this shared machine then hits both process counts of every
        # system alike, and each repeat gives a paired 2-vs-1 ratio.
        for rep in range(args.repeats):
            for k in (1, 2):
                for name, fleet in fleets.items():
                    _start_processes(fleet, name, k, args.threads)
                    try:
                        _run_celery(fleet.aw, fleet.deferred, run_id(f"w{k}r{rep}", 3, 0), 3,
                                    120)
                        samples[name][k].append(
                            rate(fleet, args.runs, args.laps, f"k{k}r{rep}"))
                    finally:
                        fleet.stop_workers()
                    log(f"{name} {k} proc, repeat {rep}: {samples[name][k][-1]:.0f} laps/s")
                if lg is not None:
                    got = lg.bench_throughput(lg_url, "langgraph", (k,), args.runs, args.laps,
                                              1, f"lg{k}r{rep}")
                    samples["langgraph"][k].append(got[str(k)]["laps_per_s"]["median"])
    finally:
        for fleet in fleets.values():
            fleet.close()
        if lg is not None:
            drop_database(lg_db)
    out: dict[str, dict[str, Any]] = {
        name: {"1": summary(by_k[1]), "2": summary(by_k[2]),
               "paired_ratio": summary(b / a for a, b in zip(by_k[1], by_k[2], strict=True)),
               "samples": by_k}
        for name, by_k in samples.items()}
    report = {"load": [load_before, os.getloadavg()], "runs": args.runs, "laps": args.laps,
              "threads": args.threads, "laps_per_s": out}
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}")
    print("| system | 1 process laps/s (min-max) | 2 processes laps/s (min-max) | 2 vs 1 "
          "(medians) | 2 vs 1 paired by repeat, median (min-max) |")
    for name, cells in out.items():
        one, two, paired = cells["1"], cells["2"], cells["paired_ratio"]
        print(f"| {name} | {one['median']:.0f} ({one['min']:.0f}-{one['max']:.0f}) | "
              f"{two['median']:.0f} ({two['min']:.0f}-{two['max']:.0f}) | "
              f"{two['median'] / one['median']:.2f}x | {paired['median']:.2f}x "
              f"({paired['min']:.2f}-{paired['max']:.2f}) |")
    Path(RESULTS / "scaling.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
