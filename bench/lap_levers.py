"""In-process lap time of several source trees side by side (issue 21 goal 1):
``python -m bench.lap_levers --trees /tmp/before,. --sizes 500 --repeats 5``.

Each sample is a fresh process with ``PYTHONPATH`` set to one tree, on a fresh
database, running the workload once to warm up and then one ``n``-lap run
through ``bench.ours.run_inprocess`` (the function ``bench.run``'s overhead
phase times), so a tree is measured with exactly its own code. The trees take
turns sample by sample, so a burst of load on a shared machine hits them
alike; the bare-INSERT floor (``bench.floor``, fsync'd INSERT of a lap's
content) is sampled in the same turns. The child only uses functions that
exist in trees from before this module, so an older checkout can be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

_CHILD = """
import json, sys, time, uuid
from sqlalchemy import Engine, event
from bench.common import create_database, drop_database
from bench.ours import inprocess_worker, run_inprocess
n = int(sys.argv[1])
name = "lv_" + uuid.uuid4().hex[:8]
url = create_database(name)
sent = [0]
try:
    w, d = inprocess_worker(url)
    run_inprocess(w, d, "warm-n20-0001", 20)
    event.listen(Engine, "before_cursor_execute", lambda *a: sent.__setitem__(0, sent[0] + 1))
    cpu = time.process_time()
    ms = run_inprocess(w, d, f"lv-n{n}-0001", n) / n * 1e3
    print(json.dumps({"ms_per_lap": ms, "cpu_ms_per_lap": (time.process_time() - cpu) / n * 1e3,
                      "statements_per_lap": sent[0] / n}))
finally:
    drop_database(name)
"""

_FLOOR = """
import json, uuid
from bench.common import RedisDb, create_database, drop_database
from bench.floor import bench_floor
name = "lf_" + uuid.uuid4().hex[:8]
url = create_database(name)
try:
    with RedisDb() as rdb:
        out = bench_floor(url, rdb.url, 300)
    print(json.dumps({"ms_per_lap": out["insert_commit_ms"]["median"]}))
finally:
    drop_database(name)
"""


def _sample(tree: Path, code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env = {k: v for k, v in env.items() if not k.startswith("AGENT_WORKER_")}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900, check=True)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lap_levers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=str(ROOT), help="comma-separated source trees")
    p.add_argument("--sizes", default="500", help="comma-separated run lengths")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-floor", action="store_true", help="skip the bare-INSERT floor")
    a = p.parse_args(argv)
    trees = [Path(t).resolve() for t in a.trees.split(",")]
    for n in (int(x) for x in a.sizes.split(",")):
        samples: dict[str, list[float]] = {str(t): [] for t in trees}
        cpu: dict[str, list[float]] = {str(t): [] for t in trees}
        sent: dict[str, list[float]] = {str(t): [] for t in trees}
        floor: list[float] = []
        loads = []
        for r in range(a.repeats):
            loads.append(os.getloadavg()[0])
            turn = trees[r % len(trees):] + trees[:r % len(trees)]
            for tree in turn:
                got = _sample(tree, _CHILD, str(n))
                samples[str(tree)].append(got["ms_per_lap"])
                cpu[str(tree)].append(got["cpu_ms_per_lap"])
                sent[str(tree)].append(got["statements_per_lap"])
            if not a.no_floor:
                floor.append(_sample(ROOT, _FLOOR)["ms_per_lap"])
        print(f"N = {n}, load (1 min) {min(loads):.1f}-{max(loads):.1f}:")
        base = statistics.median(samples[str(trees[0])])
        for name, ms in samples.items():
            med = statistics.median(ms)
            print(f"  {name}: {med:.2f} ms/lap [{min(ms):.2f}-{max(ms):.2f}]"
                  f"  x{med / base:.2f} of the first tree"
                  + (f"  x{med / statistics.median(floor):.1f} of the floor" if floor else ""))
            print(f"    this process's CPU {statistics.median(cpu[name]):.2f} ms/lap, "
                  f"{statistics.median(sent[name]):.2f} statements/lap")
        if floor:
            print(f"  bare INSERT floor: {statistics.median(floor):.2f} ms "
                  f"[{min(floor):.2f}-{max(floor):.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
