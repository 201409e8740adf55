"""A running exporter's scrape of one database, timed end to end and, statement
by statement, inside Postgres, with whatever code ``PYTHONPATH`` puts first:
run it alternately from two trees on one copy of the seeded database to set
two versions of the scrape side by side (BENCHMARKS.md, "The metrics scrape at
a million runs").

    for i in 1 2 3; do
      PYTHONPATH=/path/to/old/tree python bench/scrape_time.py --db aw_scrape_copy
      PYTHONPATH=. python bench/scrape_time.py --db aw_scrape_copy
    done

It is run as a file, not a module (``python -m`` would take ``bench`` from
the current directory): ``agent_worker``, ``store`` and the ``bench``
helpers it uses (``bench.scale.probes``, which registers a live worker for
every seeded agent and sets the event counters to the log's end, and
``bench.plans``) all come from ``PYTHONPATH``, so an older tree's scrape is
measured with that tree's code. Writes nothing but the heartbeat and what a
scrape's fold writes. ``--user agent_worker_system`` connects as the system
role (``BYPASSRLS``) instead of the app role.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime

from bench import plans
from bench.common import PG_ADMIN, libpq_url, repeat_ms
from bench.scale import probes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="a copy of the database bench.seed made")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--user", default="agent_worker", help="the role to connect as")
    a = ap.parse_args()
    server = libpq_url(PG_ADMIN).rsplit("/", 1)[0]
    url = server.replace("//agent_worker@", f"//{a.user}@", 1) + "/" + a.db
    out: dict[str, object] = {"db": a.db, "user": a.user, "code": os.path.dirname(
        plans.__file__), "load": os.getloadavg(), "at": datetime.now(UTC).isoformat()}
    store, fns, first = probes(url, first_scrape=False)
    scrape = fns["metrics"]
    out["first_scrape_ms"] = round(first, 1)
    out["scrape_ms"] = {k: round(v, 2) for k, v in repeat_ms(scrape, a.samples).items()}
    # Twice, keeping each statement's lower time: a burst of the shared
    # machine's load inflates one reading, rarely both.
    census = [plans.census(store.engine, scrape) for _ in range(2)]
    lines = [{**p.line(), "db_ms": round(min(p.ms, q.ms), 2)}
             for p, q in zip(*census, strict=True)]
    out["db_ms"] = round(sum(float(line["db_ms"]) for line in lines), 2)
    out["statements"] = lines
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    store.engine.dispose()


if __name__ == "__main__":
    main()
