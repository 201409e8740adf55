"""Recovery-time benchmark: how long a run
stands still when a lap is lost, for every way a lap can be lost.

``mid-lap``: the whole worker running the lap is SIGKILLed (a node loss, an OOM
kill), measured to the commit of that lap by another worker. The lost-message
scenarios (``bench.lost_laps``): a kill between a lap's commit and its send, a
worker killed while its claim retried through a Postgres outage, Redis killed
while a lap runs. Default settings unless overridden in the environment. What
bounds each (DESIGN.md, "Pauses and the sweeper"):

    recovery <= lease TTL (a dead lap's lease, or an unclaimed hand-off, must
                lapse; a lease was renewed at most a heartbeat before the kill)
              + sweep interval (beat's next sweep re-sends the lap)
              + queue wait + the lap itself (``--lap-seconds``)

so with the defaults (lease 10 s, heartbeat 3 s, sweep 2 s) expect 8-13 s,
never Redis's visibility timeout nor ``queued_overdue_seconds``. Not a test:
``python -m bench.recovery --scenario all --kills 10`` (README, "Measured").

By default it uses the local services (deploy/local/services.sh; started if
needed) read-only: its own database on the shared Postgres and a free Redis
database number; ``--private`` starts a throwaway Postgres and Redis instead
(always, for the scenarios that stop them).
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

from bench.common import drop_database, settings_from
from bench.lost_laps import SCENARIOS as LOST_MESSAGE
from bench.lost_laps import Bench, Sample
from tests.support import ROOT, TEST_AGENTS, Fleet, Proc, wait_for

SHARED_PG = "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker"
SHARED_REDIS = "redis://127.0.0.1:63799"


@contextlib.contextmanager
def _shared_services() -> Iterator[tuple[str, str, Any, Any]]:
    """Own database on the shared Postgres, a free Redis db number (the same
    lock files the test fixtures use, so no test eats our laps)."""
    import redis
    from sqlalchemy import create_engine, text

    from agent_worker.store.migrate import upgrade

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
        yield url, broker, None, None
    finally:
        if lock is not None:
            lock.close()
        drop_database(name, admin_url=admin.url.render_as_string(hide_password=False))
        admin.dispose()


@contextlib.contextmanager
def _private_services() -> Iterator[tuple[str, str, Any, Any]]:
    from tests.chaos.conftest import PrivatePostgres, PrivateRedis

    pg = PrivatePostgres()
    redis = PrivateRedis()
    try:
        pg.start()
        redis.start()
        yield pg.create_database(), redis.url, pg, redis
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


def mid_lap(b: Bench, kills: int) -> list[Sample]:
    """Kill the whole worker holding the run's lap, somewhere mid-lap."""
    workers = [b.fleet.worker(concurrency=1), b.fleet.worker(concurrency=1)]
    run_id = b.start()
    samples: list[Sample] = []
    for i in range(kills):
        victim, lap = wait_for(lambda: _holder(b.store, run_id, workers), timeout=120,
                               interval=0.02, what="the run's lap in flight on a worker")
        time.sleep(b.rng.uniform(0.1, 0.8) * b.lap_seconds)  # somewhere mid-lap
        run = b.store.get_run(run_id)
        if run is None or run.next_lap != lap or run.status != "running":
            continue  # the lap ended while we waited; the next one will do
        killed = time.monotonic()
        victim.kill(signal.SIGKILL)
        workers.remove(victim)
        workers.append(b.fleet.worker(concurrency=1))  # the platform replaces the node
        wait_for(_committed(b.store, run_id, lap), timeout=300, interval=0.02,
                 what=f"lap {lap} to commit after the kill")
        samples.append({"kill": i + 1, "lap": lap,
                        "seconds": round(time.monotonic() - killed, 2)})
        print(f"mid-lap {i + 1}/{kills}: lap {lap} committed "
              f"{samples[-1]['seconds']:.2f}s after SIGKILL", file=sys.stderr)
        # Let the replacement boot before the next kill, so one dead worker is
        # measured at a time.
        newest = workers[-1]
        wait_for(lambda: "ready." in newest.log.read_text(errors="replace"),  # noqa: B023
                 timeout=120, what="the replacement worker to be ready")
    return samples


SCENARIOS = {"mid-lap": mid_lap, **LOST_MESSAGE}
#: Scenarios that stop Postgres or Redis: they need the private services.
NEEDS_PRIVATE = ("claim-outage", "redis-send")


def measure(database_url: str, broker_url: str, *, scenario: str, kills: int,
            lap_seconds: float, seed: int, logdir: Path, pg: Any = None,
            redis: Any = None) -> dict[str, Any]:
    """Run ``kills`` faults of ``scenario`` on a fresh fleet; returns the figures."""
    from agent_worker.api import AgentWorker
    from agent_worker.runtime import Runtime
    from agent_worker.store.sql import SqlStore
    from agent_worker.tasks import app
    from agent_worker.tasks.dispatch import CeleryDispatcher

    # Every recovery knob keeps its default unless the caller exported it
    # (``AGENT_WORKER_LEASE_TTL_SECONDS=5 python -m bench.recovery``).
    env = dict(os.environ)
    env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=database_url,
               AGENT_WORKER_BROKER_URL=broker_url, AGENT_WORKER_AGENT_MODULES=TEST_AGENTS)
    settings = settings_from(env)
    from agent_worker.agent import registry

    registry.import_modules(TEST_AGENTS.split(","))
    app.conf["broker_url"] = broker_url
    store = SqlStore(database_url)
    fleet = Fleet(env, logdir / scenario)
    (logdir / scenario).mkdir(parents=True, exist_ok=True)
    aw = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(), settings=settings))
    bench = Bench(fleet=fleet, store=store, aw=aw, logdir=logdir, lap_seconds=lap_seconds,
                  rng=random.Random(seed), pg=pg, redis=redis)
    try:
        fleet.beat()
        samples = SCENARIOS[scenario](bench, kills)
    finally:
        fleet.close()
        store.engine.dispose()
    times = [s["seconds"] for s in samples]
    return {
        "scenario": scenario,
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


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"recovery, {result['scenario']}: {DESCRIBE[result['scenario']]}",
        f"  settings: lease {s['lease_ttl_seconds']}s, heartbeat "
        f"{s['heartbeat_interval_seconds']}s, sweep {s['sweep_interval_seconds']}s, "
        f"overdue cap {s['queued_overdue_seconds']}s, lap {s['lap_seconds']}s  "
        f"(bound ~ lease + sweep + lap = {result['bound_s']}s)",
        "  kill  lap   seconds",
        *(f"  {x['kill']:>4}  {x['lap']:>3}  {x['seconds']:>8.2f}" for x in result["samples"]),
        f"  median {result['median_s']}s   worst {result['worst_s']}s   best "
        f"{result['best_s']}s   over {result['kills']} faults",
    ]
    return "\n".join(lines)


DESCRIBE = {
    "mid-lap": "SIGKILL of the worker running the lap, to that lap's commit",
    "commit-send": "pool child killed between a lap's commit and its send, to the next commit",
    "claim-outage": "worker killed while its claim retried through a Postgres outage, "
                    "from Postgres's return",
    "redis-send": "Redis killed while a lap runs (its send fails) and restarted, from the kill",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", choices=["all", *SCENARIOS], default="mid-lap",
                        help="which way to lose a lap (default mid-lap; 'all' runs each)")
    parser.add_argument("--kills", type=int, default=10, help="faults per scenario (default 10)")
    parser.add_argument("--lap-seconds", type=float, default=1.0,
                        help="length of each lap's tool call (default 1.0)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the kill points")
    parser.add_argument("--private", action="store_true",
                        help="start a private Postgres and Redis instead of the local ones "
                             "(implied by claim-outage and redis-send, which stop them)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    results = []
    for scenario in scenarios:
        private = args.private or scenario in NEEDS_PRIVATE
        services = _private_services() if private else _shared_services()
        with services as (database_url, broker_url, pg, redis), \
                tempfile.TemporaryDirectory(prefix="aw-bench-recovery-") as logdir:
            result = measure(database_url, broker_url, scenario=scenario, kills=args.kills,
                             lap_seconds=args.lap_seconds, seed=seed, logdir=Path(logdir),
                             pg=pg, redis=redis)
        print(json.dumps(result))
        print(table(result))
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
