"""Lease renewal while a lap runs, so a tool that takes minutes keeps its run,
and a worker that stops heartbeating loses it after the lease TTL."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from agent_worker.errors import LeaseLost, RunCancelled
from agent_worker.runtime import Runtime

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease in a daemon thread; the lap calls ``check()`` between
    steps to learn that the lease was lost or the run cancelled."""

    def __init__(self, rt: Runtime, run_id: str, lap: int, owner: str) -> None:
        self._rt, self._run_id, self._lap, self._owner = rt, run_id, lap, owner
        self._stop = threading.Event()
        self._state = "ok"
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        s = self._rt.settings
        while not self._stop.wait(s.heartbeat_interval_seconds):
            try:
                state = self._rt.store.renew_lease(
                    self._run_id, self._lap, owner=self._owner, now=self._rt.clock.now(),
                    lease_seconds=s.lease_ttl_seconds)
            except Exception as e:  # the database may be restarting; keep trying
                log.warning("heartbeat for %s failed: %s", self._run_id, e)
                continue
            if state != "ok":
                self._state = state
                return

    def check(self) -> None:
        """Raise if this lap must stop before its next step."""
        if self._state == "lost":
            raise LeaseLost(f"run {self._run_id}: lease lost during lap {self._lap}")
        if self._state == "cancelled":
            raise RunCancelled(f"run {self._run_id} was cancelled")
