"""Commit-to-client latency of ``stream`` through real
workers: a ``loop`` run on a Celery worker fleet, followed live by one client
while its laps commit. Into the same run, a probe thread of this process
commits an audit event every ``--probe-every`` seconds, stamped with
``perf_counter()`` just before its commit statement; the client stamps it
again when it holds the event. Both stamps come from one clock, so the figure
is exact (commit execution included): lap commits of the workers reach the
client by the same path (the trigger's NOTIFY at commit, a wake-up, one read),
but their timestamps are the workers' database clock estimates, too coarse on
a loaded machine for milliseconds. Optional background runs keep the workers
and Postgres busy meanwhile.

    python -m bench.stream_latency --laps 200 --background 4

Uses its own database on the shared local Postgres and a free Redis db.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from bench.common import RedisDb, celery_worker, create_database, drop_database, sa_url
from tests.support import ROOT, TEST_AGENTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--laps", type=int, default=200)
    p.add_argument("--pause", type=float, default=0.02, help="seconds each lap's tool sleeps")
    p.add_argument("--background", type=int, default=0, help="other runs at the same time")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--probe-every", type=float, default=0.05)
    args = p.parse_args()

    name = f"aw_bench_stream_{uuid.uuid4().hex[:6]}"
    url = sa_url(create_database(name))
    from agent_worker.store.migrate import upgrade

    upgrade(url)
    workers = []
    try:
        with RedisDb() as redis_db, tempfile.TemporaryDirectory() as tmp:
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
            env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=url,
                       AGENT_WORKER_BROKER_URL=redis_db.url,
                       AGENT_WORKER_AGENT_MODULES=TEST_AGENTS)
            os.environ.update({k: v for k, v in env.items() if k.startswith("AGENT_WORKER_")})
            import agent_worker.api as api
            from agent_worker.core.settings import get_settings
            from agent_worker.tasks import app

            get_settings.cache_clear()
            app.conf.update(broker_url=redis_db.url)
            aw = api.client()
            workers.append(celery_worker(env, args.concurrency, "stream",
                                         Path(tmp) / "worker.log", loglevel="WARNING"))
            for _ in range(args.background):
                aw.start_run("loop", {"laps": args.laps * 2, "pause": args.pause})
            run = aw.start_run("loop", {"laps": args.laps, "pause": args.pause})
            sent: dict[int, tuple[float, float]] = {}  # probe -> (before commit, committed)
            received: dict[int, float] = {}
            laps = 0
            stop = threading.Event()

            def probe() -> None:
                n = 0
                while not stop.wait(args.probe_every):
                    n += 1
                    before = time.perf_counter()
                    aw.rt.store.record_event(run.id, None, "probe", {"n": n},
                                             now=datetime.now(UTC))
                    sent[n] = (before, time.perf_counter())

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            for event in aw.stream(run.id):
                if event.kind == "probe" and event.data is not None:
                    received[event.data["n"]] = time.perf_counter()
                laps += event.kind == "lap_committed"
            stop.set()
            prober.join()
            # From the commit's return to the writer (the commit is durable and
            # visible), and from just before the commit statement (an upper bound).
            after_commit = [(received[n] - sent[n][1]) * 1e3 for n in received if n in sent]
            with_commit = [(received[n] - sent[n][0]) * 1e3 for n in received if n in sent]
            print(json.dumps({
                "laps": laps, "probes": len(after_commit), "background_runs": args.background,
                "from_commit_ms": _quantiles(after_commit),
                "from_before_commit_ms": _quantiles(with_commit),
                "load": [round(x, 1) for x in os.getloadavg()]}))
            aw.rt.close()
    finally:
        for w in workers:
            w.kill()
        drop_database(name)


def _quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100)
    return {"p50": round(statistics.median(values), 1), "p95": round(q[94], 1),
            "max": round(max(values), 1)}


if __name__ == "__main__":
    main()
