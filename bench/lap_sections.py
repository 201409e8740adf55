"""Where an in-process lap's CPU goes, step by step, in several source trees
(issue 21 goal 1): ``python -m bench.lap_sections --trees /tmp/before,. --repeats 3``.

A profiler inflates whatever makes many small Python calls (SQLAlchemy's
execution layer, the benchmark's own text generator) and so misstates the
shares; this times the steps themselves, with ``time.process_time`` around
each, no profiler. The steps: the store's three lap calls (claim, journal of
the model's output, lap commit: statement, driver and socket time included),
building the model request, the benchmark's scripted model and tool (the
workload, not the framework), loading and dumping the checkpoint, fair share
(the send and the rate correction), and the rest of the engine. Each sample
is a fresh process on a fresh database running one ``n``-lap run through
``bench.ours.run_inprocess`` after a warm-up, the trees taking turns as in
``bench.lap_levers``; the child uses only functions older trees have too.
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

from bench.common import ROOT

_CHILD = """
import functools, json, sys, time, uuid
from bench.common import create_database, drop_database
from bench.ours import inprocess_worker, run_inprocess
from agent_worker import fairshare
from agent_worker.engine import lap as engine_lap
n = int(sys.argv[1])
name = "ls_" + uuid.uuid4().hex[:8]
url = create_database(name)
spent = {}

def timed(step, fn):
    @functools.wraps(fn)
    def step_of(*args, **kwargs):
        began = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[step] = spent.get(step, 0.0) + time.process_time() - began
    return step_of

try:
    w, d = inprocess_worker(url)
    run_inprocess(w, d, "warm-n20-0001", 20)
    store = w.rt.store
    for method, step in (("claim", "claim"), ("journal_model_output", "journal"),
                         ("commit_lap", "lap commit")):
        setattr(store, method, timed(step, getattr(store, method)))
    agent = next(iter(w.rt.registry.all()))
    client = agent.client()
    client.complete = timed("model (the bench's)", client.complete)
    for t in agent.tools:
        object.__setattr__(t, "fn", timed("tool (the bench's)", t.fn))
    engine_lap.build_request = timed("model request", engine_lap.build_request)
    engine_lap.load_checkpoint = timed("checkpoint load", engine_lap.load_checkpoint)
    engine_lap.dump_checkpoint = timed("checkpoint dump", engine_lap.dump_checkpoint)
    fairshare.used = engine_lap.fairshare.used = timed("fair share", fairshare.used)
    w.rt.send_all = timed("fair share", w.rt.send_all)
    began = time.process_time()
    run_inprocess(w, d, f"ls-n{n}-0001", n)
    total = time.process_time() - began
    steps = {k: v / n * 1e3 for k, v in spent.items()}
    steps["rest"] = (total - sum(spent.values())) / n * 1e3
    print(json.dumps({"total": total / n * 1e3, "steps": steps}))
    store.dispose()
finally:
    drop_database(name)
"""


def _sample(tree: Path, laps: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(laps)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900, check=True)
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lap_sections", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=str(ROOT), help="comma-separated source trees")
    p.add_argument("--laps", type=int, default=500, help="laps of the timed run")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    trees = [Path(t).resolve() for t in a.trees.split(",")]
    totals: dict[Path, list[float]] = {t: [] for t in trees}
    steps: dict[Path, dict[str, list[float]]] = {t: {} for t in trees}
    loads = []
    for r in range(a.repeats):
        loads.append(os.getloadavg()[0])
        for tree in trees[r % len(trees):] + trees[:r % len(trees)]:
            got = _sample(tree, a.laps)
            totals[tree].append(got["total"])
            for step, ms in got["steps"].items():
                steps[tree].setdefault(step, []).append(ms)
    print(f"N = {a.laps}, load (1 min) {min(loads):.1f}-{max(loads):.1f}, "
          f"this process's CPU ms/lap, medians of {a.repeats}:")
    names = sorted({s for t in trees for s in steps[t]},
                   key=lambda s: (s == "rest", -statistics.median(steps[trees[0]].get(s, [0]))))
    print("  " + "step".ljust(22) + "".join(t.name.rjust(14) for t in trees))
    for step in names:
        print("  " + step.ljust(22) + "".join(
            f"{statistics.median(steps[t].get(step, [0.0])):14.3f}" for t in trees))
    print("  " + "total".ljust(22) + "".join(
        f"{statistics.median(totals[t]):14.3f}" for t in trees))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
