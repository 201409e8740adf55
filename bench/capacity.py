"""How many runs one machine keeps moving (the question behind
BENCHMARKS.md's goal 3): ``python -m bench.capacity``.

Goal 3 asks one thing, 500 runs at 1 s; the issue asks the question behind
it: how many concurrent runs can one machine keep moving when each model
call takes 1 to 2 seconds? This answers it on the machine it runs on. It runs
``bench.iobound``'s measurement (2 ``threads`` workers, the loopback
provider, every lap checked committed once) at each number of runs in flight
and each model latency, all points taking turns in every pass, so a burst of
load on a shared machine hits them alike, and reports for each latency the
most runs whose median ratio to the ideal lap rate (runs / latency, ramp and
tail included) is at least ``--target``, every smaller point too.

Prints a table (median and range of the passes) and writes
``bench/results/capacity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, log, spread, summary
from bench.iobound import Fleet, run_fleet

#: Goal 3's bar: the share of the ideal lap rate a fleet must keep.
TARGET = 0.8

Point = tuple[int, float]  # (runs in flight, model latency in seconds)


def capacity(ratios: Mapping[Point, Sequence[float]], target: float) -> dict[float, int | None]:
    """For each latency, the most runs whose median ratio is at least
    ``target`` with every smaller measured count also at least ``target``
    (None: not even the smallest). A count that passes only above a failing
    one is noise, not capacity."""
    out: dict[float, int | None] = {}
    for latency in sorted({lat for _, lat in ratios}):
        best: int | None = None
        for runs in sorted(r for r, lat in ratios if lat == latency):
            if summary(ratios[(runs, latency)])["median"] < target:
                break
            best = runs
        out[latency] = best
    return out


#: The table's measured columns: a ``bench.iobound`` result field and its digits.
COLUMNS = (("ratio", 2), ("steady_ratio", 2), ("machine_cpu_ms_per_lap", 2),
           ("machine_busy", 2), ("kb_per_inflight_lap", 0))


def table(results: Mapping[Point, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Markdown rows, one per point: medians (and ranges) of the passes."""
    rows = ["| runs in flight | model latency | ideal laps/s | ratio | steady ratio | "
            "machine CPU ms a lap | cores busy | KB per lap in flight |",
            "|---|---|---|---|---|---|---|---|"]
    for (runs, latency), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = [spread([float(r[field]) for r in rs], digits) for field, digits in COLUMNS]
        rows.append(f"| {runs} | {latency:g} s | {runs / latency:.0f} | " + " | ".join(cells)
                    + " |")
    return rows


def counts(text: str) -> list[int]:
    """``--runs``: comma-separated whole numbers."""
    return [int(x) for x in text.split(",") if x]


def seconds(text: str) -> list[float]:
    """``--latencies``: comma-separated seconds."""
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=counts, default=[200, 300, 400, 500],
                   help="runs in flight, comma-separated")
    p.add_argument("--latencies", type=seconds, default=[1.0, 2.0],
                   help="model latencies (s), comma-separated")
    p.add_argument("--laps", type=int, default=Fleet.laps, help="laps per run")
    p.add_argument("--passes", type=int, default=2, help="times every point is measured")
    p.add_argument("--target", type=float, default=TARGET, help="share of the ideal lap rate")
    args = p.parse_args(argv)
    points = [(runs, lat) for lat in args.latencies for runs in args.runs]
    logdir = RESULTS / "logs" / f"capacity-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results: dict[Point, list[dict[str, Any]]] = {pt: [] for pt in points}
    for n in range(args.passes):
        # Every other pass backwards, so no point always runs on the heels of a big one.
        for runs, latency in points if n % 2 == 0 else points[::-1]:
            load = os.getloadavg()[0]
            r = run_fleet(Fleet(runs=runs, laps=args.laps, latency=latency), logdir)
            r["load_1min_before"] = load
            results[(runs, latency)].append(r)
            log(f"pass {n + 1}: {runs} runs, {latency:g} s: ratio {r['ratio']:.2f} "
                f"(steady {r['steady_ratio']:.2f}), {r['machine_cpu_ms_per_lap']:.2f} ms "
                f"of machine CPU a lap (load {load:.1f} before)")
    found = capacity({pt: [r["ratio"] for r in rs] for pt, rs in results.items()}, args.target)
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}; "
          f"{os.cpu_count()} cores; runs of {args.laps} laps; {args.passes} passes")
    print("\n".join(table(results)))
    for latency, most in found.items():
        said = f"{most} runs" if most is not None else "none of the measured counts"
        print(f"{latency:g} s model calls: at least {args.target:.0%} of the ideal lap rate "
              f"up to {said}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(RESULTS / "capacity.json").write_text(json.dumps({
        "target": args.target, "laps": args.laps, "passes": args.passes,
        "capacity": {str(k): v for k, v in found.items()},
        "points": [{"runs": runs, "latency_s": lat, "results": rs}
                   for (runs, lat), rs in results.items()]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
