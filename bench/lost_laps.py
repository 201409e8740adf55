"""Recovery when the lap's *message* is lost rather than its worker,
for ``bench.recovery``. Each scenario returns one sample per fault:
seconds from the fault (or from the failed service's return) until the lap
whose message was at stake commits. With the default settings the bound is
the hand-off's expiry (lease TTL after the send) plus a sweep interval plus
the lap itself, never ``queued_overdue_seconds``.

- ``commit-send``: the pool child is SIGKILLed right after a lap commits,
  before it sends the next one (fault point ``after_commit``).
- ``claim-outage``: Postgres is down while a worker receives a lap; its claim
  retries until the whole worker is SIGKILLed, and the message dies
  unacknowledged with it (Redis would restore it after the visibility
  timeout, hours later). Measured from Postgres's return.
- ``redis-send``: Redis dies while a lap runs and is back about a lap later,
  so that lap's send of the next lap fails (or, when losing the broker
  cancelled the lap, that lap is lost); measured from the kill.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_worker.store.base import DueLap
from tests.support import Fleet, Proc, wait_for

Sample = dict[str, Any]


@dataclass
class Bench:
    """What every scenario drives: the fleet's environment, the store, the API."""

    fleet: Fleet
    store: Any
    aw: Any
    logdir: Path
    lap_seconds: float
    rng: random.Random
    pg: Any = None
    redis: Any = None

    def next_lap(self, run_id: str) -> int:
        run = self.store.get_run(run_id)
        return int(run.next_lap) if run is not None else 0

    def committed(self, run_id: str, lap: int) -> Callable[[], bool]:
        return lambda: self.next_lap(run_id) > lap

    def start(self, laps: int = 900) -> str:
        run: Any = self.aw.start_run("loop", {"laps": laps, "pause": self.lap_seconds})
        return str(run.id)


def _ready(worker: Proc) -> None:
    wait_for(lambda: "ready." in worker.log.read_text(errors="replace"), timeout=120,
             what="a worker to be ready")


def _sample(name: str, i: int, lap: int, seconds: float) -> Sample:
    print(f"{name} {i + 1}: lap {lap} committed {seconds:.2f}s after the fault",
          file=sys.stderr)
    return {"kill": i + 1, "lap": lap, "seconds": round(seconds, 2)}


def commit_send(b: Bench, kills: int) -> list[Sample]:
    faults = b.logdir / "faults-commit-send"
    env = {"AGENT_WORKER_FAULTS": f"after_commit*{kills}",
           "AGENT_WORKER_FAULT_DIR": str(faults)}
    for _ in range(2):
        _ready(b.fleet.worker(concurrency=1, **env))
    run_id = b.start()
    samples = []
    for i in range(kills):
        marker = faults / f"after_commit.{i}"
        wait_for(marker.exists, timeout=300, interval=0.01, what=f"kill {i + 1} after a commit")
        killed = time.monotonic()
        lap = b.next_lap(run_id)  # committed just before the kill; its send never happened
        wait_for(b.committed(run_id, lap), timeout=300, interval=0.02,
                 what=f"lap {lap} to commit")
        samples.append(_sample("commit-send", i, lap, time.monotonic() - killed))
    return samples


class _Drop:
    """A dispatcher that sends nothing: the run exists, its message does not."""

    def send(self, lap: DueLap) -> None:
        return None


def claim_outage(b: Bench, kills: int) -> list[Sample]:
    from agent_worker.api import AgentWorker
    from agent_worker.runtime import Runtime
    from agent_worker.tasks.dispatch import CeleryDispatcher

    silent = AgentWorker(Runtime(store=b.store, dispatcher=_Drop(), settings=b.aw.rt.settings))
    samples = []
    for i in range(kills):
        worker = b.fleet.worker(concurrency=1)
        _ready(worker)
        run_id = str(silent.start_run("loop", {"laps": 3, "pause": b.lap_seconds}).id)
        b.pg.stop("immediate")
        CeleryDispatcher().send(DueLap(run_id, 1, "loop", "1"))
        time.sleep(2 + b.rng.random())  # the worker took it; its claim retries
        worker.kill(signal.SIGKILL)
        _ready(b.fleet.worker(concurrency=1))  # the platform replaces it
        b.pg.start()
        back = time.monotonic()
        wait_for(b.committed(run_id, 1), timeout=300, interval=0.02, what="lap 1 to commit")
        samples.append(_sample("claim-outage", i, 1, time.monotonic() - back))
    return samples


def redis_send(b: Bench, kills: int) -> list[Sample]:
    for _ in range(2):
        _ready(b.fleet.worker(concurrency=1))
    run_id = b.start()
    samples = []
    for i in range(kills):
        wait_for(lambda: b.store.get_run(run_id).status == "running", timeout=120,
                 interval=0.02, what="a lap in flight")
        lap = b.next_lap(run_id)
        time.sleep(b.rng.uniform(0.1, 0.6) * b.lap_seconds)  # somewhere mid-lap
        killed = time.monotonic()
        b.redis.stop()
        # The lap commits with Redis gone, so its send of the next lap fails
        # (unless losing the broker cancelled the lap: then that lap is at stake).
        # Redis is back as soon as a supervisor would restart it.
        at_stake = lap
        try:
            wait_for(b.committed(run_id, lap), timeout=b.lap_seconds + 1, interval=0.02)
            at_stake = lap + 1
        except AssertionError:
            pass
        b.redis.start()
        wait_for(b.committed(run_id, at_stake), timeout=300, interval=0.02,
                 what=f"lap {at_stake} to commit")
        samples.append(_sample("redis-send", i, at_stake, time.monotonic() - killed))
    return samples


SCENARIOS: dict[str, Callable[[Bench, int], list[Sample]]] = {
    "commit-send": commit_send,
    "claim-outage": claim_outage,
    "redis-send": redis_send,
}

__all__ = ["SCENARIOS", "Bench"]
