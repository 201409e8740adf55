"""A worker's garbage collector as ``tasks.garbage`` sets it, against Python's
own, paired: ``python -m bench.gc_worker``.

``bench.iobound``'s fleet (500 runs of 10 laps, a 1 s loopback model, 2
threads workers, task events off) run with ``AGENT_WORKER_WORKER_GC_THRESHOLD``
at its default (the youngest generation collected every 10,000 allocations)
and at 0 (Python's collector as it is), the two
taking turns ``--repeats`` times. The workers start with ``bench/gcprobe``
first on their ``PYTHONPATH``: its ``sitecustomize`` times every collection
(``gc.callbacks``) and writes the totals to a file per process, read here
right before and right after the measured runs. Per variant, medians over the
repeats: the ratio of ideal, the workers' CPU per lap (``/proc``), the part of
it spent collecting, the collections per generation, the longest pause (the
wall time of one collection, during which every other thread of the worker
waits for the GIL) and the machine's CPU per lap. Writes
``bench/results/gc_worker.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, summary
from bench.fleets import BenchFleet
from bench.iobound import Fleet, run_fleet

PROBE = ROOT / "bench" / "gcprobe"
#: Variant name -> the worker's settings on top of the fleet's.
VARIANTS: dict[str, dict[str, str]] = {
    "tuned (default)": {}, "Python's own (0)": {"AGENT_WORKER_WORKER_GC_THRESHOLD": "0"}}


def turns(repeats: int) -> Iterator[tuple[str, dict[str, str]]]:
    """Every variant ``repeats`` times, taking turns, the order reversed every
    other repeat so that neither always goes first."""
    order = list(VARIANTS.items())
    for i in range(repeats):
        yield from order if i % 2 == 0 else order[::-1]


def probe_env(out: Path, *, frozen: bool = False) -> dict[str, str]:
    """A worker's environment with ``bench/gcprobe`` writing into ``out``
    (``frozen``: the count of frozen objects too, which walks them all)."""
    env = {"PYTHONPATH": f"{PROBE}{os.pathsep}{ROOT}", "AGENT_WORKER_BENCH_GC_DIR": str(out)}
    if frozen:
        env["AGENT_WORKER_BENCH_GC_FROZEN"] = "1"
    return env


def _totals(fleet: BenchFleet, out: Path) -> dict[str, Any]:
    """The probe's totals summed over the fleet's worker processes, its long
    collections of all of them, and when they were read."""
    mains, _ = fleet.pids()
    sums: dict[str, Any] = {"count": [0, 0, 0], "cpu_s": [0.0, 0.0, 0.0], "long": [],
                            "at": time.time()}
    for pid in mains:
        data = json.loads((out / f"{pid}.json").read_text())
        for g in range(3):
            sums["count"][g] += data["count"][g]
            sums["cpu_s"][g] += data["cpu_s"][g]
        sums["long"] += data["long"]
    return sums


def measure(spec: Fleet, variant: dict[str, str], logdir: Path) -> dict[str, Any]:
    """One ``bench.iobound`` run with the probe; the collector's figures of the
    measured runs only (start-up and warm-up left out)."""
    with tempfile.TemporaryDirectory(prefix="aw-gc-") as tmp:
        out = Path(tmp)
        readings: list[dict[str, Any]] = []

        def read(fleet: BenchFleet) -> None:
            time.sleep(0.5)  # the probe writes every 0.2 s
            readings.append(_totals(fleet, out))

        result = run_fleet(spec, logdir, {**probe_env(out), **variant}, during=read)
    before, after = readings
    laps = spec.runs * spec.laps
    result.update(
        gc_collections=[after["count"][g] - before["count"][g] for g in range(3)],
        gc_cpu_ms_per_lap=sum(after["cpu_s"][g] - before["cpu_s"][g] for g in range(3))
        * 1e3 / laps,
        gc_longest_pause_ms=max((took for at, took in after["long"]
                                 if before["at"] - 0.5 < at <= after["at"]), default=0.0) * 1e3)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gc_worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runs", type=int, default=Fleet.runs)
    p.add_argument("--laps", type=int, default=Fleet.laps)
    args = p.parse_args(argv)
    spec = Fleet(runs=args.runs, laps=args.laps)
    logdir = RESULTS / "logs" / f"gc_worker-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for name, variant in turns(args.repeats):
        results[name].append(measure(spec, variant, logdir))
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}")
    print(f"{spec.runs} runs x {spec.laps} laps, 1 s model, 2 threads workers, events off; "
          f"medians [ranges] of {args.repeats}")
    print("| worker collector | ratio of ideal | worker CPU ms/lap | of it collecting "
          "| collections (gen 0/1/2) | longest pause ms | machine CPU ms/lap |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        def col(key: str, runs: list[dict[str, Any]] = runs) -> str:
            s = summary(r[key] for r in runs)
            return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"
        counts = "/".join(str(int(statistics.median(r["gc_collections"][g] for r in runs)))
                          for g in range(3))
        print(f"| {name} | {col('ratio')} | {col('cpu_ms_per_lap_main')} "
              f"| {col('gc_cpu_ms_per_lap')} | {counts} | {col('gc_longest_pause_ms')} "
              f"| {col('machine_cpu_ms_per_lap')} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gc_worker.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
