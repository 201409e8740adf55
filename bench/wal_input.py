"""WAL per lap of a run whose input is large, tree by tree (WAL per lap,
migration ``0022_lap_columns_last``):

    python -m bench.wal_input --trees /tmp/before,. --input-bytes 1500 --laps 100

The benchmark's workload starts runs with a 40-byte input; a real run's input
(a document, a ticket, a customer record) is often kilobytes, and it sits in
the run row, which every lap updates twice. Per tree (a fresh process with
``PYTHONPATH`` set to it, a fresh database): one in-process run of ``--laps``
laps of the workload with an input of ``--input-bytes`` of prose, and the WAL
its laps wrote per lap (``bench.walcount``: as root on the machine of
``deploy/local/services.sh``), in all and for the run row. The child uses
only functions that exist in trees from before this module.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, sys, uuid
import psycopg
from bench.common import create_database, drop_database, libpq_url
from bench.ours import _with_plan, check_finished, inprocess_worker
from bench.walcount import held, wal_bytes
from bench.workload import AGENT_NAME
size, laps = int(sys.argv[1]), int(sys.argv[2])
name = "wi_" + uuid.uuid4().hex[:8]
url = create_database(name)
try:
    w, d = inprocess_worker(url)
    document = " ".join(f"word{i}" for i in range(size))[:size]
    with held():
        for rid, n in (("warm-n5-0001", 5), (f"wi-n{laps}-0001", laps)):
            with psycopg.connect(libpq_url(url), autocommit=True) as c:
                start = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            d.hold()
            w.start_run(AGENT_NAME, {"task": "work", "document": document}, run_id=rid)
            _with_plan(w.rt.store, rid)
            d.flush()
            w.run_until_idle()
            check_finished(w.rt.store, rid, n)
        w.rt.store.dispose()
        with psycopg.connect(libpq_url(url), autocommit=True) as c:
            end = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            oid = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()"
                            ).fetchone()[0]
            runs = str(c.execute("SELECT pg_relation_filenode('runs')").fetchone()[0])
        wal = wal_bytes(oid, start, end)
    print(json.dumps(None if wal is None else {
        "wal_per_lap": wal.total / laps, "run_row_per_lap": wal.by_relation.get(runs, 0) / laps}))
finally:
    drop_database(name)
"""


def measure(tree: Path, size: int, laps: int) -> dict[str, float] | None:
    """One run of ``laps`` laps with a ``size``-byte input, on ``tree``'s code."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(size), str(laps)],
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree,
                         capture_output=True, text=True, check=True)
    found: dict[str, float] | None = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".", help="comma-separated source trees")
    ap.add_argument("--input-bytes", type=int, default=1500)
    ap.add_argument("--laps", type=int, default=100)
    a = ap.parse_args()
    for tree in a.trees.split(","):
        wal = measure(Path(tree).resolve(), a.input_bytes, a.laps)
        shown = ("WAL n/a (pg_waldump needs the postgres user)" if wal is None else
                 f"WAL {wal['wal_per_lap']:.0f} B/lap, of it the run row "
                 f"{wal['run_row_per_lap']:.0f} B/lap")
        print(f"{tree}: input {a.input_bytes} B, {a.laps} laps: {shown}")


if __name__ == "__main__":
    main()
