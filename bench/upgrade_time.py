"""How long this tree's migrations take on a database seeded by an older tree
(a migration that rewrites the run rows, ``0022_lap_columns_last``,
must say what it costs at a million runs):

    git archive <before> | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python -m bench.upgrade_time --before /tmp/before

Seeds ``--db`` with ``bench.seed`` as the older tree runs it (its schema head,
its rows: by default 1,000,000 finished, 100,000 paused and 10,000 active
runs), then times ``store.migrate.upgrade`` to this tree's head, and prints
the seconds, the revisions and the run table's size before and after (the
UPDATE leaves the old row versions behind until a vacuum). The database is
kept for a look; ``--drop`` drops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from agent_worker.store.migrate import current, upgrade
from bench.common import create_database, drop_database, libpq_url, sa_url


def _table_bytes(url: str) -> dict[str, Any]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_table_size('runs'), pg_total_relation_size('runs')"
                           ).fetchone()
    assert row is not None
    return {"runs_table": int(row[0]), "runs_with_indexes": int(row[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the older tree that seeds the database")
    ap.add_argument("--db", default="aw_upgrade")
    ap.add_argument("--finished", default="1000000")
    ap.add_argument("--paused", default="100000")
    ap.add_argument("--active", default="10000")
    ap.add_argument("--drop", action="store_true")
    a = ap.parse_args()
    url = sa_url(create_database(a.db))  # the seed creates it again
    env = {**os.environ, "PYTHONPATH": a.before}
    subprocess.run([sys.executable, "-m", "bench.seed", "--db", a.db, "--finished", a.finished,
                    "--paused", a.paused, "--active", a.active], env=env, cwd=a.before,
                   check=True)
    seeded_at, before = current(url), _table_bytes(url)
    t0 = time.perf_counter()
    upgrade(url)
    seconds = time.perf_counter() - t0
    print(json.dumps({"from": seeded_at, "to": current(url), "seconds": round(seconds, 1),
                      "before": before, "after": _table_bytes(url)}))
    if a.drop:
        drop_database(a.db)


if __name__ == "__main__":
    main()
