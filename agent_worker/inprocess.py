"""Run agents inside this process, with no broker: for notebooks, scripts and
unit tests. Same lap engine, same store interface; laps run when you call
``run_until_idle()`` (or ``wait()``), one at a time, in order."""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from typing import Any

from agent_worker.api import AgentWorker
from agent_worker.core.clock import Clock, SystemClock
from agent_worker.core.settings import Settings, get_settings
from agent_worker.engine.lap import run_lap
from agent_worker.runtime import Runtime
from agent_worker.store.base import DueLap
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore


class LocalQueue:
    """The in-process stand-in for the broker."""

    def __init__(self) -> None:
        self.pending: deque[DueLap] = deque()

    def send(self, lap: DueLap) -> None:
        self.pending.append(lap)


class InProcessWorker(AgentWorker):
    """An ``AgentWorker`` that is also its own worker and sweeper.

    ``database_url`` defaults to a SQLite file; Postgres works too. The schema
    is migrated on construction.
    """

    def __init__(self, database_url: str = "sqlite:///agent_worker.db", *,
                 settings: Settings | None = None, clock: Clock | None = None,
                 **overrides: Any) -> None:
        base = settings or get_settings()
        upgrade(database_url)
        self.queue = LocalQueue()
        self._name = f"inprocess:{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        super().__init__(Runtime(
            store=SqlStore(database_url), dispatcher=self.queue,
            settings=base.model_copy(update={"database_url": database_url, **overrides}),
            clock=clock or SystemClock()))

    def close(self) -> None:
        """Stop this worker's heartbeat thread and close its database connections."""
        self.rt.close()

    def run_until_idle(self, *, max_laps: int = 100_000) -> int:
        """Run queued laps (and what the sweeper finds due) until nothing is
        runnable now; returns the number of laps attempted."""
        done = 0
        while done < max_laps:
            if not self.queue.pending and self.sweep() == 0:
                return done
            while self.queue.pending and done < max_laps:
                lap = self.queue.pending.popleft()
                run_lap(self.rt, lap.run_id, lap.lap)
                done += 1
        return done

    def sweep(self) -> int:
        """One sweeper pass. This process is the worker of every version it
        has registered, so it records itself as their live server first."""
        self.rt.store.heartbeat(self._name, self.rt.registry.served_versions(),
                                now=self.rt.clock.now())
        return super().sweep()

    def _idle(self, seconds: float) -> None:
        if self.run_until_idle() == 0:
            time.sleep(seconds)
