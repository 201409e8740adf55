"""Fan-out and fan-in benchmark for child runs.

One ``fan`` run starts N ``kid`` children from one tool call and waits for all
of them (``tests.child_agents``: scripted models, instant, no tool calls in the
kids), through real Celery workers, Postgres and Redis. Reported, on the
database's clock:

- **start**: from the parent's creation to the ``children_started`` event (all
  N rows written, one transaction) and to the commit of the parent's first lap
  (all N first laps sent to the broker);
- **fan-in delay**: from the last child's end to the commit of the parent's
  resuming lap (its model now holds all N results). The wake itself happens
  inside the last child's terminal transaction, so it adds nothing of its own;
- **per-child overhead against a plain run**: wall time of the whole fan-out
  divided by N, next to the same N ``kid`` runs started one by one with
  ``start_run`` (no parent) on the same fleet.

    python -m bench.fanout --children 1000 --workers 2 --concurrency 2

Uses its own database on the local Postgres (``AGENT_WORKER_TEST_PG``) and a
free Redis database number (the lock files the tests use); never starts or
stops the shared services. Default timings (lease 10 s, sweep 2 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import drop_database
from tests.support import TEST_AGENTS, Fleet, lock_redis_db, wait_for

PG = "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker"
REDIS = "redis://127.0.0.1:63799"


@contextlib.contextmanager
def _services() -> Iterator[tuple[str, str]]:
    """A fresh database on the shared Postgres and a Redis database of our own."""
    import redis
    from sqlalchemy import create_engine, text

    from agent_worker.store.migrate import upgrade

    admin = create_engine(os.environ.get("AGENT_WORKER_TEST_PG", PG),
                          isolation_level="AUTOCOMMIT")
    name = f"aw_fanout_{uuid.uuid4().hex[:8]}"
    taken = lock_redis_db(range(15, 0, -1))
    if taken is None:
        raise RuntimeError("every Redis test database is in use")
    lock, db = taken
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin.url.set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        broker = f"{REDIS}/{db}"
        r = redis.Redis.from_url(broker)
        r.flushdb()
        r.close()
        yield url, broker
    finally:
        lock.close()
        drop_database(name, admin_url=admin.url.render_as_string(hide_password=False))
        admin.dispose()


def _seconds(a: datetime | None, b: datetime | None) -> float:
    assert a is not None and b is not None
    return round((b - a).total_seconds(), 3)


def _event_at(aw: Any, run_id: str, kind: str, lap: int | None = None) -> datetime:
    found: datetime = next(e.created_at for e in aw.events(run_id)
                           if e.kind == kind and (lap is None or e.lap == lap))
    return found


def measure(aw: Any, n: int, timeout: float) -> dict[str, Any]:
    """One fan-out of ``n`` and the baseline of ``n`` plain runs."""
    # Baseline first: n plain kid runs, started one by one.
    t0 = time.monotonic()
    plain = [aw.start_run("kid", {"n": i}).id for i in range(n)]
    start_plain = time.monotonic() - t0
    wait_for(lambda: not aw.list_runs(status="queued", agent="kid", limit=1)
             and not aw.list_runs(status="running", agent="kid", limit=1),
             timeout=timeout, interval=0.5, what="plain runs")
    runs = [aw.get_run(r) for r in plain]
    assert all(r.status == "succeeded" for r in runs)
    plain_wall = _seconds(min(r.created_at for r in runs), max(r.finished_at for r in runs))

    parent = aw.start_run("fan", {"n": n})
    done = aw.wait(parent.id, timeout=timeout, poll=0.5)
    assert done.status == "succeeded", done.error_message
    told = done.result["children"]
    assert len(told) == n and all(c["status"] == "succeeded" for c in told)
    kids = [aw.get_run(c["run_id"]) for c in told]
    last_end = max(k.finished_at for k in kids)
    created = done.created_at
    fan_wall = _seconds(created, done.finished_at)
    return {
        "children": n,
        "start_rows_s": _seconds(created, _event_at(aw, parent.id, "children_started")),
        "start_sent_s": _seconds(created, _event_at(aw, parent.id, "lap_committed", 1)),
        "children_done_s": _seconds(created, last_end),
        "fan_in_resumed_s": _seconds(last_end, _event_at(aw, parent.id, "lap_committed", 2)),
        "fan_wall_s": fan_wall,
        "fan_per_child_ms": round(fan_wall / n * 1000, 2),
        "plain_start_calls_s": round(start_plain, 3),
        "plain_wall_s": plain_wall,
        "plain_per_run_ms": round(plain_wall / n * 1000, 2),
        "overhead_per_child_ms": round((fan_wall - plain_wall) / n * 1000, 2),
        "charged_input_tokens": done.input_tokens,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--children", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    with _services() as (url, broker), tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
        env.update(PYTHONPATH=str(Path(__file__).resolve().parent.parent),
                   AGENT_WORKER_DATABASE_URL=url, AGENT_WORKER_BROKER_URL=broker,
                   AGENT_WORKER_AGENT_MODULES=f"{TEST_AGENTS},tests.child_agents")
        for k, v in env.items():
            if k.startswith("AGENT_WORKER_"):
                os.environ[k] = v
        import agent_worker.api as api
        import tests.child_agents  # noqa: F401  (registers fan and kid here)
        from agent_worker.core.settings import get_settings
        from agent_worker.tasks import app

        get_settings.cache_clear()
        app.conf.update(broker_url=broker)
        api.configure(None)
        aw = api.client()
        fleet = Fleet(env, Path(tmp))
        try:
            for _ in range(args.workers):
                fleet.worker(concurrency=args.concurrency)
            fleet.beat()
            warm = aw.start_run("kid", {"n": 0})
            aw.wait(warm.id, timeout=120)
            load = os.getloadavg()
            result = measure(aw, args.children, args.timeout)
            result.update(workers=args.workers, concurrency=args.concurrency,
                          load_before=[round(x, 1) for x in load],
                          load_after=[round(x, 1) for x in os.getloadavg()],
                          at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            print(json.dumps(result, indent=2))
        finally:
            fleet.close()
            aw.rt.store.dispose()


if __name__ == "__main__":
    main()
