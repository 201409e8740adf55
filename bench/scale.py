"""Costs at a million runs: the same measures on a seeded
database and on an empty one, side by side in one run.

    python -m bench.seed --finished 1000000 --paused 100000 --active 10000 --db aw_scale
    python -m bench.scale --db aw_scale

* **lap**: the in-process lap of ``bench.ours`` (same workload, ``--laps`` laps
  a run), runs alternating between the empty and the seeded database so a
  burst of load on this shared machine hits both alike; goal: seeded within
  10 % of empty. The laps alone (``laps_only``): the in-process worker's
  sweeper pass at each run's end is the **sweep** below, timed on its own
  (spread over 50 laps it was most of the seeded database's excess).
* **sweep**: one sweeper pass (``Store.sweep``: expired leases, due timers,
  approval timeouts, unclaimed hand-offs) with a live worker's heartbeat for
  every seeded agent; goal under 50 ms.
* **metrics**: one scrape of the exporter's registry (``agent_worker.metrics``
  and ``sharemetrics``), after a first scrape that has read the event log up
  to now (reported apart: it pays once per exporter start); goal under 200 ms.
* **listing**: a tenant's runs by status, by label and by a search term
  (``Store.list_runs`` and ``store.listing.search_runs``, 100 a page); goal
  under 50 ms.

Every SELECT of the sweep, the scrape and the listings is then re-run under
``EXPLAIN (ANALYZE, BUFFERS)`` on the seeded database (``bench.plans``): the
time inside Postgres and any table read by sequential scan; the listings once
more with the tenancy policy not forced (``db_ms_rls_not_forced``, in a
transaction rolled back), which shows what row-level security costs their plans. Before measuring,
the seeded runs' leases, hand-offs, timers and approval timeouts are pushed a
day ahead, so a pass finds the same nothing-due state however long ago the
seed ran. The empty database is dropped at the end; the seeded one is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from prometheus_client import generate_latest
from sqlalchemy import text

from agent_worker.core.settings import get_settings
from agent_worker.metrics import StoreCollector, registry_for
from agent_worker.store.listing import RunFilter, search_runs
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from bench import plans
from bench.common import (
    PG_ADMIN,
    System,
    create_database,
    drop_database,
    interleaved_runs,
    libpq_url,
    log,
    repeat_ms,
    sa_url,
)
from bench.ours import InProcess
from bench.seed import AGENTS

GOALS_MS = {"sweep": 50.0, "metrics": 200.0, "listing": 50.0}
LAP_RATIO = 1.10
UNFORCED = "ALTER TABLE runs NO FORCE ROW LEVEL SECURITY"
TENANT = "tenant-40"  # holds queue=vip runs (run numbers divisible by 10)

RENEW = [
    "UPDATE runs SET lease_expires_at = now() + interval '1 day' "
    "WHERE status IN ('queued', 'running')",
    "UPDATE runs SET enqueued_at = now() WHERE status = 'queued'",
    "UPDATE runs SET wake_at = greatest(wake_at, now() + interval '1 hour') "
    "WHERE status = 'sleeping'",
    "UPDATE approvals SET timeout_at = greatest(timeout_at, now() + interval '1 day') "
    "WHERE status = 'pending'",
]


def renew(url: str) -> None:
    """Push the seeded runs' deadlines a day ahead (see the module docstring)."""
    with psycopg.connect(libpq_url(url), options="-c agent_worker.tenant=*") as conn:
        for sql in RENEW:
            conn.execute(sql)


def listings(store: SqlStore) -> dict[str, Callable[[], object]]:
    """What an operator lists for one tenant, by status and by label."""
    def by_status(status: Any) -> Callable[[], object]:
        return lambda: store.list_runs(tenant=TENANT, status=status, limit=100)

    def by_filter(f: RunFilter) -> Callable[[], object]:
        def page() -> object:
            with store.engine.connect() as c:
                return search_runs(c, f, cursor=None, limit=100).runs
        return page

    return {
        "list_runs status=running": by_status("running"),
        "list_runs status=queued": by_status("queued"),
        "list_runs status=waiting": by_status("waiting"),
        "list_runs status=sleeping": by_status("sleeping"),
        "list_runs status=succeeded": by_status("succeeded"),
        "list_runs status=failed": by_status("failed"),
        "search_runs status=waiting": by_filter(RunFilter(tenant=TENANT, status="waiting")),
        "search_runs label customer=acme-40": by_filter(
            RunFilter(tenant=TENANT, labels={"customer": "acme-40"})),
        "search_runs label queue=vip": by_filter(
            RunFilter(tenant=TENANT, labels={"queue": "vip"})),
        "search_runs label queue=vip + status=sleeping": by_filter(
            RunFilter(tenant=TENANT, labels={"queue": "vip"}, status="sleeping")),
        # The console's search box: no match reads the whole window (the worst page).
        "search_runs text no match": by_filter(RunFilter(tenant=TENANT, text="no-such-run")),
        "search_runs text error words": by_filter(RunFilter(tenant=TENANT, text="timed out")),
    }


def probes(url: str, *, first_scrape: bool
           ) -> tuple[SqlStore, dict[str, Callable[[], object]], float]:
    """The store of ``url`` and the sweep, scrape and listings to time on it,
    plus how long the first scrape took: with ``first_scrape``, an exporter
    just started, reading the whole event log (minutes at a million runs);
    without, one that has been running and read it already."""
    store = SqlStore(sa_url(url))
    settings = get_settings()
    now = datetime.now(UTC)
    store.heartbeat("scale-bench", [(f"agent-{i}", "1") for i in range(AGENTS)], now=now)
    registry = registry_for(store, settings)
    if not first_scrape:
        # An exporter that has been running: its event counters have read up to now.
        with store.engine.connect() as c:
            top = c.execute(text("SELECT coalesce(max(id), 0) FROM events")).scalar_one()
        collector = next(c for c in registry._collector_to_names
                         if isinstance(c, StoreCollector))
        collector.events.watermark = int(top)
    t0 = time.perf_counter()
    generate_latest(registry)
    first = (time.perf_counter() - t0) * 1e3

    def sweep() -> object:
        return store.sweep(now=datetime.now(UTC), handoff_seconds=settings.lease_ttl_seconds,
                           resend_max_seconds=settings.queued_overdue_seconds)

    return store, {"sweep": sweep, "metrics": lambda: generate_latest(registry),
                   **listings(store)}, first


def goal_of(name: str) -> float:
    return GOALS_MS["listing"] if "_runs" in name else GOALS_MS[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="aw_scale", help="the database bench.seed made")
    ap.add_argument("--laps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--first-scrape", action="store_true",
                    help="also time an exporter's first scrape (reads every event)")
    a = ap.parse_args()
    seeded = libpq_url(PG_ADMIN).rsplit("/", 1)[0] + "/" + a.db
    empty_name = f"aw_scale_empty_{os.getpid()}"
    empty = create_database(empty_name)
    try:
        upgrade(sa_url(empty))
        renew(seeded)
        out: dict[str, Any] = {"load": os.getloadavg(), "at": datetime.now(UTC).isoformat()}
        stores = {}
        for label, url in (("empty", empty), ("seeded", seeded)):
            store, fns, first = probes(url, first_scrape=a.first_scrape)
            stores[label] = (store, fns)
            out[f"first_scrape_ms_{label}"] = round(first, 1)
        for name in stores["seeded"][1]:
            for label in ("empty", "seeded"):
                took = repeat_ms(stores[label][1][name], a.samples)
                out.setdefault(name, {})[label] = {k: round(v, 2) for k, v in took.items()}
            med = out[name]["seeded"]["median"]
            out[name]["goal_ms"] = goal_of(name)
            out[name]["met"] = med < goal_of(name)
            log(f"{name}: empty {out[name]['empty']['median']:.2f} ms, seeded {med:.2f} ms")
        systems: list[System] = []
        for label, url in (("empty", empty), ("seeded", seeded)):
            ours = InProcess(url, laps_only=True)
            ours.name = label
            systems.append(ours)
        errors: dict[str, str] = {}
        laps = interleaved_runs(systems, [a.laps], a.repeats, f"scale{os.getpid()}", errors)
        for done in systems:
            done.close()
        lap = {k: v[str(a.laps)]["ms_per_lap"] for k, v in laps.items()}
        ratio = lap["seeded"]["median"] / lap["empty"]["median"]
        out["lap_ms"] = {**lap, "ratio": round(ratio, 3), "met": ratio <= LAP_RATIO,
                         "errors": errors}
        seeded_store, fns = stores["seeded"]
        out["plans"] = {name: [p.line() for p in plans.census(seeded_store.engine, fn)]
                        for name, fn in fns.items()}
        for name, lines in out["plans"].items():
            # Inside Postgres, summed over the probe's SELECTs: what the size
            # of the database costs, apart from round trips and client CPU.
            in_db = sum(line["db_ms"] for line in lines)
            out[name].update(db_ms=round(in_db, 2), met_in_db=in_db < goal_of(name))
            if "_runs" in name:
                # The same statements with the tenancy policy not forced on the
                # owner (rolled back): what row-level security costs the plan.
                free = plans.census(seeded_store.engine, fns[name], first=UNFORCED)
                out[name]["db_ms_rls_not_forced"] = round(sum(p.ms for p in free), 2)
        out["load_after"] = os.getloadavg()
        print(json.dumps(out, indent=1, default=str))
        for store, _ in stores.values():
            store.engine.dispose()
    finally:
        drop_database(empty_name)


if __name__ == "__main__":
    main()
