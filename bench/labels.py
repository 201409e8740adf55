"""Listing runs by label at a million runs.

Seeds N runs straight into a fresh Postgres database with one
``INSERT ... SELECT generate_series`` (not through the API: a million
``start_run`` calls would measure the API, not the listing), ANALYZEs, then
times the store's own listing query (``store.listing.search_runs``: the query
``runs list --label`` and ``AgentWorker.search_runs`` run) for labels of
different selectivity, a second page through the cursor, and a label with
status and tenant filters. Prints one JSON line per case (median, p95, max,
rows) and the EXPLAIN of the selective case.

    python -m bench.labels --runs 1000000 --repeat 50
    python -m bench.labels --db aw_scale --repeat 30   # on bench.seed's database

With ``--db`` it seeds nothing and drops nothing: it times the same cases on
the database ``bench.seed`` made (1,110,000 runs with the same three labels,
under row-level security like a deployed one), connected as the store's own
processes are (``store.db.make_engine``: the system scope).

Labels per run: ``customer`` (10,000 values: 100 runs each), ``queue``
(``vip`` on 10 %), ``region`` (7 values). The database is dropped at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from agent_worker.store.db import make_engine
from agent_worker.store.listing import RunFilter, _query, decode_cursor, search_runs
from agent_worker.store.migrate import upgrade
from bench.common import drop_database

ADMIN_URL = "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker"

SEED = text("""
INSERT INTO runs (id, tenant, agent_name, agent_version, status, next_lap, lap_attempts,
                  input, limits, laps_used, input_tokens, output_tokens, cost_micros,
                  retention, recoveries, created_at, updated_at, labels)
SELECT 'run-' || g, 'tenant-' || (g % 100), 'agent-' || (g % 5), '1',
       (ARRAY['succeeded', 'queued', 'waiting', 'failed'])[1 + g % 4], 1, 0,
       '{}'::json, '{}'::json, 0, 0, 0, 0, 'full', 0,
       timestamp '2026-01-01' + g * interval '1 second',
       timestamp '2026-01-01' + g * interval '1 second',
       jsonb_build_object('customer', 'acme-' || (g % 10000),
                          'queue', CASE WHEN g % 10 = 0 THEN 'vip' ELSE 'std' END,
                          'region', 'eu-' || (g % 7))
FROM generate_series(1, :n) AS g
""")


def _time(fn: Callable[[], Any], repeat: int) -> dict[str, Any]:
    samples, rows = [], 0
    fn()  # warm the cache: the figure is a warm listing, as an operator's repeated one
    for _ in range(repeat):
        t = time.perf_counter()
        rows = len(fn())
        samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 2),
            "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 2),
            "max_ms": round(samples[-1], 2), "rows": rows}


def _driver(value: Any) -> Any:
    """A bind value as the driver takes it (what the column types would do)."""
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _db_ms(c: Connection, f: RunFilter, cursor: str | None, limit: int,
           repeat: int) -> float:
    """Median execution time inside Postgres (EXPLAIN ANALYZE) of the very
    statement the store runs: what the database costs, without the client's
    Python and the machine's other load."""
    after = decode_cursor(cursor) if cursor else None
    compiled = _query(c, f, after, limit + 1).compile(dialect=c.dialect)
    params = {k: _driver(v) for k, v in compiled.params.items()}
    times = []
    for _ in range(repeat):
        (plan,) = c.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string,
                                    params).scalar_one()
        times.append(float(plan["Execution Time"]))
    return round(statistics.median(times), 3)


def _seeded(url: str, n: int) -> Engine:
    upgrade(url)
    engine = make_engine(url)  # the system scope: the policy of 0003_tenancy checks inserts too
    t = time.perf_counter()
    with engine.begin() as c:
        c.execute(SEED, {"n": n})  # the trigger of 0016 fills run_labels
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE runs"))
        c.execute(text("VACUUM ANALYZE run_labels"))
    print(json.dumps({"seeded": n, "seconds": round(time.perf_counter() - t, 1)}))
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--db", help="an existing database (bench.seed's) to time, as is")
    a = ap.parse_args()
    name = a.db or f"aw_bench_labels_{uuid.uuid4().hex[:6]}"
    admin = create_engine(a.admin_url, isolation_level="AUTOCOMMIT")
    if not a.db:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    url = a.admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        engine = make_engine(url) if a.db else _seeded(url, a.runs)
        with engine.connect() as c:
            runs = int(c.execute(text("SELECT count(*) FROM runs")).scalar_one())

            def page(f: RunFilter, cursor: str | None = None) -> Any:
                return search_runs(c, f, cursor=cursor, limit=a.limit).runs

            selective = RunFilter(labels={"customer": "acme-42"})
            common = RunFilter(labels={"queue": "vip"})
            second = search_runs(c, common, cursor=None, limit=a.limit).next_cursor
            cases: dict[str, tuple[RunFilter, str | None]] = {
                "customer=acme-42 (100 runs)": (selective, None),
                "queue=vip (10% of runs)": (common, None),
                "queue=vip, page 2 (cursor)": (common, second),
                "customer=acme-42 + queue=std + region=eu-0": (RunFilter(
                    labels={"customer": "acme-42", "queue": "std", "region": "eu-0"}), None),
                "customer=acme-42 + status=queued + tenant": (RunFilter(
                    labels={"customer": "acme-42"}, status="queued", tenant="tenant-42"),
                    None),
                "no match (customer=nobody)": (RunFilter(labels={"customer": "nobody"}), None),
            }
            for label, (f, cur) in cases.items():
                print(json.dumps({
                    "case": label, "runs": runs, "limit": a.limit,
                    "db_median_ms": _db_ms(c, f, cur, a.limit, a.repeat),
                    **_time(functools.partial(page, f, cur), a.repeat)}))
            compiled = _query(c, selective, None, a.limit + 1).compile(dialect=c.dialect)
            plan = c.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + compiled.string,
                                     {k: _driver(v) for k, v in compiled.params.items()})
            print("\n".join(r[0] for r in plan))
        engine.dispose()
    finally:
        if not (a.keep or a.db):
            drop_database(name, admin_url=admin.url.render_as_string(hide_password=False))
        admin.dispose()


if __name__ == "__main__":
    main()
