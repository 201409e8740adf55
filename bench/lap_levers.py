"""In-process lap time of several source trees side by side:
``python -m bench.lap_levers --trees /tmp/before,. --sizes 500 --repeats 5``.

Each sample is a fresh process with ``PYTHONPATH`` set to one tree, on a fresh
database, running the workload once to warm up and then one ``n``-lap run
through ``bench.ours.run_inprocess`` (the function ``bench.run``'s overhead
phase times), so a tree is measured with exactly its own code. The trees take
turns sample by sample, so a burst of load on a shared machine hits them
alike; the bare-INSERT floor (``bench.floor``, fsync'd INSERT of a lap's
content) is sampled in the same turns. The child only uses functions that
exist in trees from before this module, so an older checkout can be measured.

Also per tree: the share of the run row's updates that were HOT
(``pg_stat_user_tables``, the sample's own database) and the WAL bytes per lap
that database wrote, by relation (``bench.walcount``: ``pg_waldump`` as the
``postgres`` user; "n/a" elsewhere), against the floor's WAL per INSERT.
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
from bench.walcount import held, wal_bytes

_CHILD = """
import json, sys, time, uuid
from sqlalchemy import event
from bench.common import create_database, drop_database
from bench.ours import inprocess_worker, run_inprocess
n = int(sys.argv[1])
name = "lv_" + uuid.uuid4().hex[:8]
url = create_database(name)
sent = [0]
checkouts = [0]
try:
    w, d = inprocess_worker(url)
    run_inprocess(w, d, "warm-n20-0001", 20)
    import psycopg
    from sqlalchemy.pool import Pool
    from bench.common import libpq_url
    with psycopg.connect(libpq_url(url), autocommit=True) as c:
        lsn0 = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    # Counted at the driver, whichever layer sends them (SQLAlchemy or psycopg itself).
    def counted(send):
        def sending(self, *args, **kwargs):
            sent[0] += 1
            return send(self, *args, **kwargs)
        return sending
    psycopg.Cursor.execute = counted(psycopg.Cursor.execute)
    psycopg.Cursor.executemany = counted(psycopg.Cursor.executemany)
    event.listen(Pool, "checkout", lambda *a: checkouts.__setitem__(0, checkouts[0] + 1))
    cpu = time.process_time()
    ms = run_inprocess(w, d, f"lv-n{n}-0001", n) / n * 1e3
    cpu = (time.process_time() - cpu) / n * 1e3
    statements, checked_out = sent[0], checkouts[0]
    getattr(w.rt.store, "dispose", w.rt.store.engine.dispose)()  # backends report counters at exit
    with psycopg.connect(libpq_url(url), autocommit=True) as c:
        lsn1 = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        oid = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()"
                        ).fetchone()[0]
        names = dict(c.execute("SELECT relfilenode::text, relname FROM pg_class").fetchall())
        for _ in range(50):
            upd, hot = c.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                                 "WHERE relname = 'runs'").fetchone()
            if upd >= 2 * n:
                break
            time.sleep(0.1)
    print(json.dumps({"ms_per_lap": ms, "cpu_ms_per_lap": cpu,
                      "statements_per_lap": statements / n, "checkouts_per_lap": checked_out / n,
                      "wal": [oid, lsn0, lsn1],
                      "names": names, "runs_updates": [upd, hot]}))
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
    import psycopg
    from bench.common import libpq_url
    from bench.floor import lap_row
    with psycopg.connect(libpq_url(url)) as c:
        c.execute("CREATE TABLE floor_wal (id bigserial PRIMARY KEY, run_id text NOT NULL, "
                  "lap int NOT NULL, body jsonb NOT NULL)")
        c.commit()
        lsn0 = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        for lap in range(1, 301):
            c.execute("INSERT INTO floor_wal (run_id, lap, body) VALUES ('f', %s, %s)",
                      (lap, lap_row(lap)))
            c.commit()
        lsn1 = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        oid = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()"
                        ).fetchone()[0]
    print(json.dumps({"ms_per_lap": out["insert_commit_ms"]["median"],
                      "wal": [oid, lsn0, lsn1], "laps": 300}))
finally:
    drop_database(name)
"""


def _sample(tree: Path, code: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env = {k: v for k, v in env.items() if not k.startswith("AGENT_WORKER_")}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900, check=True)
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
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
        checkouts: dict[str, list[float]] = {str(t): [] for t in trees}
        wal: dict[str, list[float]] = {str(t): [] for t in trees}
        hot: dict[str, list[float]] = {str(t): [] for t in trees}
        where: dict[str, dict[str, float]] = {str(t): {} for t in trees}
        floor: list[float] = []
        floor_wal: list[float] = []
        loads = []
        for r in range(a.repeats):
            loads.append(os.getloadavg()[0])
            turn = trees[r % len(trees):] + trees[:r % len(trees)]
            for tree in turn:
                with held():
                    got = _sample(tree, _CHILD, str(n))
                    found = wal_bytes(*got["wal"])
                samples[str(tree)].append(got["ms_per_lap"])
                cpu[str(tree)].append(got["cpu_ms_per_lap"])
                sent[str(tree)].append(got["statements_per_lap"])
                checkouts[str(tree)].append(got["checkouts_per_lap"])
                upd, hot_upd = got["runs_updates"]
                hot[str(tree)].append(hot_upd / max(upd, 1))
                if found is not None:
                    wal[str(tree)].append(found.total / n)
                    for rel, size in found.by_relation.items():
                        rel = got["names"].get(rel, rel)
                        where[str(tree)][rel] = where[str(tree)].get(rel, 0) + size / n
            if not a.no_floor:
                with held():
                    got = _sample(ROOT, _FLOOR)
                    found = wal_bytes(*got["wal"])
                floor.append(got["ms_per_lap"])
                if found is not None:
                    floor_wal.append(found.total / got["laps"])
        print(f"N = {n}, load (1 min) {min(loads):.1f}-{max(loads):.1f}:")
        base = statistics.median(samples[str(trees[0])])
        for name, ms in samples.items():
            med = statistics.median(ms)
            print(f"  {name}: {med:.2f} ms/lap [{min(ms):.2f}-{max(ms):.2f}]"
                  f"  x{med / base:.2f} of the first tree"
                  + (f"  x{med / statistics.median(floor):.1f} of the floor" if floor else ""))
            # Paired by turn (the trees ran back to back): a drift of the
            # shared machine's speed over the run cancels out of the ratio.
            paired = [c / b for c, b in zip(cpu[name], cpu[str(trees[0])], strict=True)]
            print(f"    this process's CPU {statistics.median(cpu[name]):.2f} ms/lap "
                  f"[{min(cpu[name]):.2f}-{max(cpu[name]):.2f}]"
                  + (f" (x{statistics.median(paired):.2f} of the first tree's, paired by "
                     f"turn [{min(paired):.2f}-{max(paired):.2f}])" if name != str(trees[0])
                     else "") + ", "
                  f"{statistics.median(sent[name]):.2f} statements/lap, "
                  f"{statistics.median(checkouts[name]):.2f} pool checkouts/lap, "
                  f"run-row updates HOT {statistics.median(hot[name]):.0%}")
            if wal[name]:
                per = statistics.median(wal[name])
                top = sorted(((rel, size / len(wal[name])) for rel, size in where[name].items()),
                             key=lambda kv: -kv[1])[:8]
                print(f"    WAL {per:.0f} B/lap"
                      + (f" (x{per / statistics.median(floor_wal):.2f} of the floor)"
                         if floor_wal else "")
                      + ": " + ", ".join(f"{rel} {size:.0f}" for rel, size in top))
        if floor:
            print(f"  bare INSERT floor: {statistics.median(floor):.2f} ms "
                  f"[{min(floor):.2f}-{max(floor):.2f}]"
                  + (f", WAL {statistics.median(floor_wal):.0f} B/lap" if floor_wal else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
