"""Recovery-time benchmark (issue 4, item 8): how long a run stands still when
the worker running its lap is SIGKILLed (a node loss, an OOM kill).

Measured from the SIGKILL of the whole worker (main process and pool) mid-lap
to the commit of that lap by another worker, over ``--kills`` kills, with the
default settings unless overridden in the environment. What bounds it
(DESIGN.md, "Pauses and the sweeper"):

    recovery <= lease TTL (the dead lap's lease must lapse; it was renewed at most
                a heartbeat interval before the kill)
              + sweep interval (beat's next sweep re-sends the lap)
              + queue wait + the lap itself (``--lap-seconds``)

so with the defaults (lease 10 s, heartbeat 3 s, sweep 2 s) expect 8-13 s,
never Redis's visibility timeout. Not a test: ``python -m bench.recovery --kills 10``.

By default it uses the local services (deploy/local/services.sh; started if
needed) read-only: its own database on the shared Postgres and a free Redis
database number; ``--private`` starts a throwaway Postgres and Redis instead.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tests.support import ROOT, TEST_AGENTS, Fleet, Proc, wait_for

SHARED_PG = "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker"
SHARED_REDIS = "redis://127.0.0.1:63799"


@contextlib.contextmanager
def _shared_services() -> Iterator[tuple[str, str]]:
    """Own database on the shared Postgres, a free Redis db number (the same
    lock files the test fixtures use, so no test eats our laps)."""
    import redis
    from sqlalchemy import create_engine, text

    from store.migrate import upgrade

    subprocess.run([str(ROOT / "deploy/local/services.sh"), "start"], check=True,
                   capture_output=True)
    name = f"aw_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(os.environ.get("AGENT_WORKER_TEST_PG", SHARED_PG),
                          isolation_level="AUTOCOMMIT")
    lock: IO[str] | None = None
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin.url.set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        for db in range(15, 0, -1):
            lock = open(f"/tmp/agent-worker-test-redis-{db}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                lock.close()
                lock = None
        if lock is None:
            raise RuntimeError("every Redis test database is in use")
        broker = f"{os.environ.get('AGENT_WORKER_TEST_REDIS', SHARED_REDIS)}/{db}"
        r = redis.Redis.from_url(broker)
        r.flushdb()
        r.close()
        yield url, broker
    finally:
        if lock is not None:
            lock.close()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def _private_services() -> Iterator[tuple[str, str]]:
    from tests.chaos.conftest import PrivatePostgres, PrivateRedis

    pg = PrivatePostgres()
    redis = PrivateRedis()
    try:
        pg.start()
        redis.start()
        yield pg.create_database(), redis.url
    finally:
        redis.destroy()
        pg.destroy()


def _owner_pid(owner: str | None) -> int | None:
    return int(owner.split(":")[1]) if owner else None


def _holder(store: Any, run_id: str, workers: list[Proc]) -> tuple[Proc, int] | None:
    """The worker whose pool child holds the run's lease, and the lap it runs."""
    run = store.get_run(run_id)
    if run is None or run.status != "running":
        return None
    pid = _owner_pid(run.lease_owner)
    for w in workers:
        if pid is not None and w.alive() and pid in w.children():
            return w, int(run.next_lap)
    return None


def _committed(store: Any, run_id: str, lap: int) -> Callable[[], bool]:
    def check() -> bool:
        run = store.get_run(run_id)
        return run is not None and run.next_lap > lap

    return check


def measure(database_url: str, broker_url: str, *, kills: int, lap_seconds: float,
            seed: int, logdir: Path) -> dict[str, Any]:
    """Kill the worker holding the run's lap ``kills`` times; returns the figures."""
    from agent_worker.settings import Settings
    from store.sql import SqlStore

    rng = random.Random(seed)
    # Every recovery knob keeps its default unless the caller exported it
    # (``AGENT_WORKER_LEASE_TTL_SECONDS=5 python -m bench.recovery``).
    env = dict(os.environ)
    env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=database_url,
               AGENT_WORKER_BROKER_URL=broker_url, AGENT_WORKER_AGENT_MODULES=TEST_AGENTS)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    store = SqlStore(database_url)
    fleet = Fleet(env, logdir)
    samples: list[dict[str, Any]] = []
    try:
        workers = [fleet.worker(concurrency=1), fleet.worker(concurrency=1)]
        fleet.beat()
        run_id = _start_run(settings, store, broker_url, lap_seconds)
        for i in range(kills):
            victim, lap = wait_for(lambda: _holder(store, run_id, workers), timeout=120,
                                   interval=0.02, what="the run's lap in flight on a worker")
            time.sleep(rng.uniform(0.1, 0.8) * lap_seconds)  # somewhere mid-lap
            run = store.get_run(run_id)
            if run is None or run.next_lap != lap or run.status != "running":
                continue  # the lap ended while we waited; the next one will do
            killed = time.monotonic()
            victim.kill(signal.SIGKILL)
            workers.remove(victim)
            workers.append(fleet.worker(concurrency=1))  # the platform replaces the node
            wait_for(_committed(store, run_id, lap), timeout=300, interval=0.02,
                     what=f"lap {lap} to commit after the kill")
            seconds = time.monotonic() - killed
            samples.append({"kill": i + 1, "lap": lap, "seconds": round(seconds, 2)})
            print(f"kill {i + 1}/{kills}: lap {lap} committed {seconds:.2f}s after SIGKILL",
                  file=sys.stderr)
            # Let the replacement boot before the next kill, so one dead worker is
            # measured at a time.
            newest = workers[-1]
            wait_for(lambda: "ready." in newest.log.read_text(errors="replace"),  # noqa: B023
                     timeout=120, what="the replacement worker to be ready")
    finally:
        fleet.close()
        store.engine.dispose()
    times = [s["seconds"] for s in samples]
    return {
        "kills": len(samples),
        "median_s": round(statistics.median(times), 2) if times else None,
        "worst_s": round(max(times), 2) if times else None,
        "best_s": round(min(times), 2) if times else None,
        "samples": samples,
        "settings": {
            "lease_ttl_seconds": settings.lease_ttl_seconds,
            "heartbeat_interval_seconds": settings.heartbeat_interval_seconds,
            "sweep_interval_seconds": settings.sweep_interval_seconds,
            "queued_overdue_seconds": settings.queued_overdue_seconds,
            "lap_seconds": lap_seconds,
        },
        "bound_s": round(settings.lease_ttl_seconds + settings.sweep_interval_seconds
                         + lap_seconds, 2),
        "seed": seed,
    }


def _start_run(settings: Any, store: Any, broker_url: str, lap_seconds: float) -> str:
    """A long ``loop`` run whose every lap is one ``lap_seconds`` read step."""
    from agent_worker.agent import registry
    from agent_worker.api import AgentWorker
    from agent_worker.runtime import Runtime
    from tasks import app
    from tasks.dispatch import CeleryDispatcher

    registry.import_modules(TEST_AGENTS.split(","))
    app.conf["broker_url"] = broker_url
    aw = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(), settings=settings))
    return aw.start_run("loop", {"laps": 900, "pause": lap_seconds}).id


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "recovery after SIGKILL of the worker running the lap",
        f"  settings: lease {s['lease_ttl_seconds']}s, heartbeat "
        f"{s['heartbeat_interval_seconds']}s, sweep {s['sweep_interval_seconds']}s, "
        f"lap {s['lap_seconds']}s  (bound ~ lease + sweep + lap = {result['bound_s']}s)",
        "  kill  lap   seconds",
        *(f"  {x['kill']:>4}  {x['lap']:>3}  {x['seconds']:>8.2f}" for x in result["samples"]),
        f"  median {result['median_s']}s   worst {result['worst_s']}s   best "
        f"{result['best_s']}s   over {result['kills']} kills",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=10, help="kills to measure (default 10)")
    parser.add_argument("--lap-seconds", type=float, default=1.0,
                        help="length of each lap's tool call (default 1.0)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the kill points")
    parser.add_argument("--private", action="store_true",
                        help="start a private Postgres and Redis instead of the local ones")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    services = _private_services() if args.private else _shared_services()
    with services as (database_url, broker_url), \
            tempfile.TemporaryDirectory(prefix="aw-bench-recovery-") as logdir:
        result = measure(database_url, broker_url, kills=args.kills,
                         lap_seconds=args.lap_seconds, seed=seed, logdir=Path(logdir))
    print(json.dumps(result))
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
