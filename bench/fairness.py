"""Fairness benchmark: does a flood from one tenant cost another
more than its fair share of delay?

2 workers of concurrency 4, beat, a fleet cap ``--fleet-cap`` (default 10: 8
slots plus 2 messages of pipeline). Runs are ``loop`` runs of 2 laps whose
first lap sleeps ``--pause`` seconds in a tool.

1. idle: tenant ``b`` starts ``--others`` runs on the idle fleet;
2. flood: tenant ``a`` submits ``--flood`` runs (one batch: created, then one
   admission pass), and once the fleet is saturated tenant ``b`` starts the
   same ``--others`` runs again.

Reported: b's p50/p95 time to first lap (run created to its first lap's
commit) and to finish, idle against flood; the fleet's throughput (laps
committed per second) while b's flood-time runs were in the system (its
capacity: the same with ``--fleet-cap 0``, no admission at all, which is also
the picture before fair share: b's runs queue behind a's in Redis); the
largest number of laps in flight seen by a sampler reading the database every
100 ms, against the cap; and the most lap messages seen waiting in Redis.

    python -m bench.fairness                      # 2,000 + 20, as in the issue
    python -m bench.fairness --fleet-cap 0        # the same without fair share
    python -m bench.fairness --flood 300          # a shorter flood
    python -m bench.fairness --throughput 3       # capped vs uncapped, 3 rounds each

``--throughput N`` measures the fleet's throughput over the whole flood (the
issue's "within 10% of capacity"): N rounds, each one flood with the fleet cap
``--fleet-cap`` and one with no cap at all (``--fleet-cap 0``: no admission,
every lap straight to Redis, the fleet's *capacity*), the two taking turns
(ABBA: the order flips each round, so a drifting machine load weighs on both
alike). A round's figure is laps committed per second (and runs finished per
second) from the first lap of tenant a's flood starting to the last of the
2,000 + 20 runs finishing; reported are each configuration's median, min and
max, and the capped median as a share of the uncapped one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    RedisDb,
    create_database,
    drop_database,
    sa_url,
    settings_from,
    summary,
)
from tests.support import ROOT, TEST_AGENTS, Fleet, wait_for


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _times(aw: Any, ids: list[str]) -> dict[str, float]:
    first, done = [], []
    for run_id in ids:
        run = aw.get_run(run_id)
        commits = [e.created_at for e in aw.events(run_id) if e.kind == "lap_committed"]
        first.append((min(commits) - run.created_at).total_seconds())
        done.append((run.finished_at - run.created_at).total_seconds())
    return {"first_lap_p50": _pct(first, 0.5), "first_lap_p95": _pct(first, 0.95),
            "finish_p50": _pct(done, 0.5), "finish_p95": _pct(done, 0.95)}


class Sampler(threading.Thread):
    """Laps in flight, fleet-wide and per tenant, read every 100 ms."""

    def __init__(self, aw: Any, broker: str) -> None:
        import redis

        super().__init__(daemon=True)
        self.aw, self.stop, self.peak, self.samples = aw, threading.Event(), 0, 0
        self.peak_tenant: dict[str, int] = {}
        self.redis, self.redis_peak = redis.Redis.from_url(broker), 0

    def run(self) -> None:
        from agent_worker.tasks.routing import lap_queue

        while not self.stop.is_set():
            lines = self.aw.queues()
            self.samples += 1
            # lap messages waiting in Redis (the unacked ones are held by workers)
            self.redis_peak = max(self.redis_peak, int(self.redis.llen(lap_queue("loop", "1"))))
            self.peak = max(self.peak, sum(q.in_flight for q in lines))
            for q in lines:
                self.peak_tenant[q.tenant] = max(self.peak_tenant.get(q.tenant, 0), q.in_flight)
            self.stop.wait(0.1)


def _batch(aw: Any, tenant: str, n: int, pause: float) -> list[str]:
    """``n`` runs written first, then sent in one admission pass (a bulk submit)."""
    from agent_worker.core.budget import BudgetLedger
    from agent_worker.core.checkpoint import Checkpoint, dump_checkpoint
    from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
    from agent_worker.core.messages import Message
    from agent_worker.store.base import DueLap, NewRun

    spec = aw.rt.registry.get("loop")
    body = json.dumps({"laps": 2, "pause": pause}, sort_keys=True)
    runs = []
    for i in range(n):
        now = aw.rt.clock.now()
        ckpt = Checkpoint(lap=0, agent_name=spec.name, agent_version=spec.version,
                          message_count=1, budget=BudgetLedger.start(spec.budget, now))
        run, _ = aw.rt.store.create_run(NewRun(
            id=f"{tenant}-{i}-{uuid.uuid4().hex[:6]}", tenant=tenant, agent_name=spec.name,
            agent_version=spec.version, input={"laps": 2, "pause": pause},
            limits=spec.budget.model_dump(mode="json"), retention="full",
            checkpoint=dump_checkpoint(ckpt), schema_version=CHECKPOINT_SCHEMA_VERSION,
            messages=[Message(role="user", content=body)], now=now))
        runs.append(run)
    aw.rt.send_all([DueLap(r.id, r.next_lap, r.agent_name, r.agent_version) for r in runs])
    return [r.id for r in runs]


def _window(aw: Any, start: datetime, end: datetime) -> dict[str, float]:
    """Laps committed per second in [start, end], and the mean claim-to-commit
    time of those laps (the fleet's capacity is the same figure measured with
    ``--fleet-cap 0``: no admission, every lap straight to Redis)."""
    from sqlalchemy import select

    from agent_worker.metrics import lap_seconds
    from agent_worker.store.rows import events

    with aw.rt.store.engine.connect() as c:
        rows = c.execute(select(events.c.data).where(
            events.c.kind == "lap_committed", events.c.created_at.between(start, end))).all()
    seconds = (end - start).total_seconds()
    lap_s = [s for s in (lap_seconds(r.data) for r in rows) if s is not None]
    return {"laps": len(rows), "seconds": round(seconds, 1),
            "laps_per_s": round(len(rows) / seconds, 2),
            "mean_lap_s": round(statistics.mean(lap_s), 3) if lap_s else float("nan")}


def _whole_flood(aw: Any, loaded: list[str], timeout: float) -> dict[str, float]:
    """Wait until every run has ended, then the throughput over the whole
    flood: from the first lap of a's flood starting (its commit time less its
    duration) to the last of a's runs and b's ``loaded`` runs finishing."""
    from sqlalchemy import func, or_, select

    from agent_worker.core.vocabulary import TERMINAL
    from agent_worker.metrics import lap_seconds
    from agent_worker.store.rows import events, runs

    engine = aw.rt.store.engine

    def left() -> int:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(runs).where(
                runs.c.status.not_in(sorted(TERMINAL)))).scalar_one())

    wait_for(lambda: left() == 0, timeout=timeout, interval=0.5, what="the whole flood")
    flood_runs = runs.c.tenant == "a"
    with engine.connect() as c:
        first = c.execute(select(events.c.created_at, events.c.data)
                          .join(runs, runs.c.id == events.c.run_id)
                          .where(flood_runs, events.c.kind == "lap_committed")
                          .order_by(events.c.created_at).limit(1)).one()
        start = first.created_at.timestamp() - (lap_seconds(first.data) or 0.0)
        counted = or_(flood_runs, runs.c.id.in_(loaded))
        end = c.execute(select(func.max(runs.c.finished_at)).where(counted)).scalar_one()
        n_runs = int(c.execute(select(func.count()).select_from(runs)
                               .where(counted)).scalar_one())
        laps = int(c.execute(select(func.count()).select_from(events)
                             .join(runs, runs.c.id == events.c.run_id)
                             .where(counted, events.c.kind == "lap_committed")).scalar_one())
    seconds = end.timestamp() - start
    return {"laps": laps, "runs": n_runs, "seconds": round(seconds, 2),
            "laps_per_s": round(laps / seconds, 2), "runs_per_s": round(n_runs / seconds, 2)}


def measure(flood: int, others: int, pause: float, fleet_cap: int, logdir: Path,
            *, whole: bool = False) -> dict[str, Any]:
    from agent_worker.agent import registry
    from agent_worker.api import AgentWorker
    from agent_worker.runtime import Runtime
    from agent_worker.store.migrate import upgrade
    from agent_worker.store.sql import SqlStore
    from agent_worker.tasks import app
    from agent_worker.tasks.dispatch import CeleryDispatcher

    name = f"aw_fair_{uuid.uuid4().hex[:8]}"
    url = sa_url(create_database(name))
    upgrade(url)
    with RedisDb() as rdb:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
        env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=url,
                   AGENT_WORKER_BROKER_URL=rdb.url, AGENT_WORKER_AGENT_MODULES=TEST_AGENTS,
                   AGENT_WORKER_MAX_LAPS_IN_FLIGHT=str(fleet_cap))
        settings = settings_from(env)
        registry.import_modules(TEST_AGENTS.split(","))
        app.conf["broker_url"] = rdb.url
        store = SqlStore(url)
        aw = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(), settings=settings))
        fleet = Fleet(env, logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        sampler = Sampler(aw, rdb.url)
        try:
            for _ in range(2):
                fleet.worker(concurrency=4)
            fleet.beat()
            warm = aw.start_run("loop", {"laps": 2, "pause": pause}, tenant="warmup").id
            aw.wait(warm, timeout=120)
            sampler.start()
            idle = [aw.start_run("loop", {"laps": 2, "pause": pause}, tenant="b").id
                    for _ in range(others)]
            for run_id in idle:
                aw.wait(run_id, timeout=600)
            idle_times = _times(aw, idle)
            t0 = time.monotonic()
            _batch(aw, "a", flood, pause)
            submit_s = time.monotonic() - t0
            # a's laps fill the fleet (without admission: a's whole flood is in Redis)
            wait_for(lambda: sum(q.in_flight for q in aw.queues()) >= 6, timeout=300,
                     what="a busy fleet")
            time.sleep(2)
            start = aw.rt.clock.now()
            loaded = [aw.start_run("loop", {"laps": 2, "pause": pause}, tenant="b").id
                      for _ in range(others)]
            for run_id in loaded:
                aw.wait(run_id, timeout=1800)
            end = aw.rt.clock.now()
            flood_times = _times(aw, loaded)
            window: dict[str, Any] = _window(aw, start, end)
            if whole:
                window = {"while_b": window, "whole_flood": _whole_flood(aw, loaded, 3600)}
        finally:
            sampler.stop.set()
            fleet.close()
            store.dispose()
            drop_database(name)
    return {
        "workers": "2 x concurrency 4", "fleet_cap": fleet_cap, "flood_runs": flood,
        "other_runs": others, "laps_per_run": 2, "pause_s": pause,
        "flood_submit_s": round(submit_s, 1),
        "b_idle": idle_times, "b_during_flood": flood_times,
        "ratio": {k: round(flood_times[k] / idle_times[k], 2) for k in idle_times},
        "throughput": window,
        "in_flight_peak": sampler.peak, "in_flight_peak_by_tenant": sampler.peak_tenant,
        "samples": sampler.samples, "cap_exceeded": 0 < fleet_cap < sampler.peak,
        "redis_lap_messages_peak": sampler.redis_peak,
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _measure_apart(flood: int, others: int, pause: float, fleet_cap: int,
                   logdir: Path) -> dict[str, Any]:
    """``measure(..., whole=True)`` in a process of its own: each flood gets
    a Redis db of its own, and a process that has sent to one keeps its
    Celery producer's connection to it (seen: a second flood's laps went to
    the first flood's db, and no worker ever saw them)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.fairness", "--whole", "--flood", str(flood),
         "--others", str(others), "--pause", str(pause), "--fleet-cap", str(fleet_cap),
         "--logdir", str(logdir)], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def throughput(rounds: int, flood: int, others: int, pause: float, fleet_cap: int,
               logdir: Path) -> dict[str, Any]:
    """``rounds`` floods capped and as many uncapped, taking turns (ABBA)."""
    rates: dict[int, list[float]] = {fleet_cap: [], 0: []}
    per_run: dict[int, list[float]] = {fleet_cap: [], 0: []}
    log: list[dict[str, Any]] = []
    for i in range(rounds):
        order = [fleet_cap, 0] if i % 2 == 0 else [0, fleet_cap]
        for cap in order:
            before = _load()
            try:
                r = _measure_apart(flood, others, pause, cap, logdir)
            except RuntimeError as e:  # reported, and the round goes on
                log.append({"round": i + 1, "fleet_cap": cap, "error": str(e)[-500:]})
                print(json.dumps(log[-1]), flush=True)
                continue
            whole = r["throughput"]["whole_flood"]
            rates[cap].append(whole["laps_per_s"])
            per_run[cap].append(whole["runs_per_s"])
            entry = {"round": i + 1, "fleet_cap": cap, "load_before": before,
                     "load_after": _load(), **whole,
                     "b_ratio": r["ratio"], "cap_exceeded": r["cap_exceeded"],
                     "in_flight_peak": r["in_flight_peak"], "samples": r["samples"],
                     "redis_lap_messages_peak": r["redis_lap_messages_peak"]}
            log.append(entry)
            print(json.dumps(entry, default=str), flush=True)
    capped, capacity = summary(rates[fleet_cap]), summary(rates[0])
    return {"rounds": log,
            "laps_per_s": {"capped": capped, "uncapped_capacity": capacity},
            "runs_per_s": {"capped": summary(per_run[fleet_cap]),
                           "uncapped_capacity": summary(per_run[0])},
            "capped_share_of_capacity": round(capped["median"] / capacity["median"], 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=2000)
    p.add_argument("--others", type=int, default=20)
    p.add_argument("--pause", type=float, default=0.2)
    p.add_argument("--fleet-cap", type=int, default=10)
    p.add_argument("--logdir", type=Path, default=ROOT / "bench" / "results" / "fairness")
    p.add_argument("--throughput", type=int, default=0, metavar="ROUNDS",
                   help="capped against uncapped over the whole flood, ROUNDS of each")
    p.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.whole:  # one flood of --throughput, in a process of its own
        print(json.dumps(measure(args.flood, args.others, args.pause, args.fleet_cap,
                                 args.logdir, whole=True), default=str))
        return 0
    if args.throughput:
        out = throughput(args.throughput, args.flood, args.others, args.pause,
                         args.fleet_cap or 10, args.logdir)
        print(json.dumps(out, indent=2, default=str))
        return 0
    result = measure(args.flood, args.others, args.pause, args.fleet_cap, args.logdir)
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
