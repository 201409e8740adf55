"""Where the Celery hand-off goes: ``python -m bench.handoff``.

The workload of ``bench.run``'s overhead phase, one run at a time, in process
and through one Celery worker of each pool variant, the runs taking turns so
load bursts hit every variant alike. Besides the wall time per lap it reads the
CPU seconds the worker's main process and its pool children spent per lap
(``/proc``), which is where the hand-off's cost shows: prefork pays a pipe
round trip and a second process's wake-up per lap, task events pay Redis
publishes. Prints a table and writes ``bench/results/handoff.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, create_database, drop_database, interleaved_runs
from bench.fleets import BenchFleet
from bench.ours import OWNERS, InProcess, _run_celery
from bench.workload import run_id

VARIANTS: dict[str, dict[str, str]] = {
    "prefork": {"AGENT_WORKER_WORKER_POOL": "prefork"},
    "prefork-noevents": {"AGENT_WORKER_WORKER_POOL": "prefork",
                         "AGENT_WORKER_TASK_EVENTS": "false"},
    "threads": {"AGENT_WORKER_WORKER_POOL": "threads"},
    "threads-noevents": {"AGENT_WORKER_WORKER_POOL": "threads",
                         "AGENT_WORKER_TASK_EVENTS": "false"},
    "threads64-noevents": {"AGENT_WORKER_WORKER_POOL": "threads",
                           "AGENT_WORKER_TASK_EVENTS": "false",
                           "AGENT_WORKER_WORKER_CONCURRENCY": "64"},
    "solo-noevents": {"AGENT_WORKER_WORKER_POOL": "solo",
                      "AGENT_WORKER_TASK_EVENTS": "false"},
}
"""Pool, concurrency and task-event settings compared (concurrency 1 unless
the variant sets ``AGENT_WORKER_WORKER_CONCURRENCY``: ``deploy/``'s 64 lets the
worker fetch a run's next lap before it has acked the current one); the rest is
the deployed configuration."""


class CelerySystem:
    """One fleet with one worker as a ``bench.common.System``;
    accumulates the worker's CPU seconds over the runs it measures."""

    owners: Mapping[str, str] = OWNERS

    def __init__(self, name: str, env: Mapping[str, str], logdir: Path,
                 tree: Path | None = None) -> None:
        # A worker of another source tree (``--trees``) is named after it.
        tag = f"@{tree.name}" if tree is not None else ""
        self.name = f"celery-{name}{tag}"
        self.fleet = BenchFleet(f"handoff_{name}{tag.replace('@', '_')}", env, logdir,
                                tree=tree or ROOT)
        self.url = self.fleet.url
        self.fleet.worker(int(env.get("AGENT_WORKER_WORKER_CONCURRENCY", "1")))
        self.cpu_main = self.cpu_children = 0.0
        self.laps = 0
        try:
            self.run(run_id(f"warm{name}", 5, 0), 5)
        except BaseException:
            self.close()
            raise
        self.cpu_main = self.cpu_children = 0.0
        self.laps = 0

    def run(self, rid: str, n: int) -> float:
        main0, child0 = self.fleet.cpu()
        seconds = _run_celery(self.fleet.aw, self.fleet.deferred, rid, n, timeout=120 + n)
        main1, child1 = self.fleet.cpu()
        self.cpu_main += main1 - main0
        self.cpu_children += child1 - child0
        self.laps += n
        return seconds

    def close(self) -> None:
        self.fleet.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="50,200", help="run lengths (laps)")
    p.add_argument("--repeats", type=int, default=5, help="runs per (variant, size)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="pool variants to compare")
    p.add_argument("--trees", default="",
                   help="comma-separated other source trees (e.g. `git archive` of a base "
                        "commit): each variant also runs with workers from each, paired")
    args = p.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",") if t]
    sizes = [int(x) for x in args.sizes.split(",")]
    logdir = RESULTS / "logs" / f"handoff-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    inproc_db = "bench_handoff_inprocess"
    systems: list[Any] = []
    errors: dict[str, str] = {}
    try:
        systems.append(InProcess(create_database(inproc_db)))
        for name in args.variants.split(","):
            for tree in trees:
                systems.append(CelerySystem(name, VARIANTS[name], logdir, tree))
            systems.append(CelerySystem(name, VARIANTS[name], logdir))
        out = interleaved_runs(systems, sizes, args.repeats, "ho", errors)
    finally:
        for s in systems:
            s.close()
        drop_database(inproc_db)
    report = _report(out, systems, sizes, load_before, errors)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "handoff.json").write_text(json.dumps(report, indent=2))
    return 1 if errors else 0


def _report(out: dict[str, dict[str, Any]], systems: list[Any], sizes: list[int],
            load_before: tuple[float, float, float], errors: dict[str, str]) -> dict[str, Any]:
    load = (load_before, os.getloadavg())
    print(f"\nload average (1, 5, 15 min) before {load[0]}, after {load[1]}")
    head = " | ".join(f"N={n} ms/lap (min-max)" for n in sizes)
    print(f"| system | {head} | vs in-process | CPU ms/lap main | CPU ms/lap children |")
    rows: dict[str, Any] = {}
    base = out.get("ours", {})
    for s in systems:
        cells = out.get(s.name, {})
        if not cells:
            continue
        ms = [cells[str(n)]["ms_per_lap"] for n in sizes]
        ratio = [m["median"] / base[str(n)]["ms_per_lap"]["median"]
                 for m, n in zip(ms, sizes, strict=True)] if base else []
        laps = getattr(s, "laps", 0)
        cpu = ((s.cpu_main / laps * 1e3, s.cpu_children / laps * 1e3) if laps else None)
        rows[s.name] = {"ms_per_lap": dict(zip(map(str, sizes), ms, strict=True)),
                        "ratio": ratio, "cpu_ms_per_lap_main_children": cpu}
        cpu_txt = f"{cpu[0]:.2f} | {cpu[1]:.2f}" if cpu else "— | —"
        print(f"| {s.name} | " + " | ".join(
            f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})" for m in ms)
            + f" | {' / '.join(f'{r:.2f}x' for r in ratio)} | {cpu_txt} |")
    for name, err in errors.items():
        print(f"ERROR {name}: {err}")
    return {"load": load, "rows": rows, "errors": errors}


if __name__ == "__main__":
    raise SystemExit(main())
