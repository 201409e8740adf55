"""``bench.iobound`` for two source trees taking turns, in one invocation:
``python -m bench.io_sidebyside --baseline /path/to/other/tree``.

Why: on a shared machine the load moves by a factor of several within
minutes, so a before/after pair measured an hour apart says little. Here the
baseline tree and this one run alternately, ABBA (baseline, ours, ours,
baseline, ...), each as its own ``python -m bench.iobound`` with its own tree
on ``PYTHONPATH``, so a burst of load hits both alike. A baseline tree is e.g.
``git archive main | tar -x -C /tmp/main``. The two runs cannot overlap
(``bench.iobound`` uses one database name), hence turns, not parallel runs.

Prints one row per run and the medians, with the load before each run. Any
other option (``--runs 400``, ``--latency 2``, ...) is passed on to every
``bench.iobound`` run, of both trees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import ROOT, log

FIELDS = ("laps_per_s", "ratio", "steady_ratio", "cpu_ms_per_lap_main", "machine_cpu_ms_per_lap",
          "kb_per_inflight_lap")


def one(tree: Path, extra: list[str]) -> dict[str, Any]:
    """One ``bench.iobound`` run of ``tree``; its result JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "bench.iobound", *extra], cwd=tree, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads((tree / "bench/results/iobound.json").read_text())
    result["load_1min_before"] = load
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.io_sidebyside", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="the other source tree")
    p.add_argument("--rounds", type=int, default=2, help="ABBA pairs")
    args, extra = p.parse_known_args(argv)
    trees = {"baseline": args.baseline.resolve(), "ours": ROOT}
    rows: dict[str, list[dict[str, Any]]] = {"baseline": [], "ours": []}
    for r in range(args.rounds):
        order = ["baseline", "ours"] if r % 2 == 0 else ["ours", "baseline"]
        for name in order:
            res = one(trees[name], extra)
            rows[name].append(res)
            log(f"{name}: " + ", ".join(f"{f} {res[f]:.2f}" for f in FIELDS)
                + f" (load {res['load_1min_before']:.1f})")
    print(f"\nbench.iobound {' '.join(extra)}, {args.rounds} ABBA rounds")
    print("| tree | " + " | ".join(FIELDS) + " | load before |")
    print("|---" * (len(FIELDS) + 2) + "|")
    for name, results in rows.items():
        cells = [f"{statistics.median(x[f] for x in results):.2f}" for f in FIELDS]
        loads = ", ".join(f"{x['load_1min_before']:.1f}" for x in results)
        print(f"| {name} | " + " | ".join(cells) + f" | {loads} |")
    print("\nours minus baseline, paired by round: median [min-max], rounds where ours is higher")
    for field in FIELDS:
        print(f"  {field}: {paired(rows['baseline'], rows['ours'], field)}")
    return 0


def paired(baseline: list[dict[str, Any]], ours: list[dict[str, Any]], field: str) -> str:
    """``field`` of ours minus the baseline's, run by run within each round
    (the two ran minutes apart, ABBA, under about the same load): a change
    smaller than the machine's drift over a whole invocation can still show
    here, as a sign that holds in most rounds."""
    gaps = [o[field] - b[field] for b, o in zip(baseline, ours, strict=True)]
    higher = sum(gap > 0 for gap in gaps)
    return (f"{statistics.median(gaps):+.2f} [{min(gaps):+.2f} to {max(gaps):+.2f}], "
            f"{higher} of {len(gaps)}")


if __name__ == "__main__":
    raise SystemExit(main())
