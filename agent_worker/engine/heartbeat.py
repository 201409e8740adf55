"""Lease renewal while a lap runs, so a tool that takes minutes keeps its run,
and a worker that stops heartbeating loses it after the lease TTL.

One daemon thread per runtime (``Runtime.heartbeat``, restarted in a forked
child) renews every lap in flight that has run longer than the heartbeat
interval, all of them in one statement per pass; a lap that finishes sooner
never touches it, so the common short lap pays no extra write. ``Runtime.close()`` stops the thread.

A lap running longer than ``lap_time_limit_seconds`` is no longer renewed: its
lease expires and the sweeper hands the run to another worker, whose fenced
commit wins. Under the prefork pool Celery's hard time limit kills such a lap
first; the threads pool has no time limits, and without this a hung tool would
hold its run for ever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType

from agent_worker.core.errors import LeaseLost, RunCancelled
from agent_worker.runtime import Runtime

log = logging.getLogger(__name__)


class Heartbeat:
    """One lap's lease; the lap calls ``check()`` between steps to learn that
    the lease was lost or the run cancelled."""

    def __init__(self, rt: Runtime, run_id: str, lap: int, owner: str) -> None:
        self.rt, self.run_id, self.lap, self.owner = rt, run_id, lap, owner
        self.state = "ok"
        self.started = self.renewed = time.monotonic()

    def __enter__(self) -> Heartbeat:
        _beater(self.rt).add(self)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        _beater(self.rt).remove(self)

    def renew(self) -> None:
        s = self.rt.settings
        try:
            state = self.rt.store.renew_lease(self.run_id, self.lap, owner=self.owner,
                                              now=self.rt.clock.now(),
                                              lease_seconds=s.lease_ttl_seconds)
        except Exception as e:  # the database may be restarting; keep trying
            log.warning("heartbeat for %s failed: %s", self.run_id, e)
            return
        self.renewed = time.monotonic()
        self.state = state

    def check(self) -> None:
        """Raise if this lap must stop before its next step."""
        if self.state == "lost":
            raise LeaseLost(f"run {self.run_id}: lease lost during lap {self.lap}")
        if self.state == "cancelled":
            raise RunCancelled(f"run {self.run_id} was cancelled")


class _Beater:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.laps: set[Heartbeat] = set()
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self.thread.start()

    def add(self, hb: Heartbeat) -> None:
        with self.lock:
            self.laps.add(hb)

    def remove(self, hb: Heartbeat) -> None:
        with self.lock:
            self.laps.discard(hb)

    def stop(self) -> None:
        self._stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        interval = self.rt.settings.heartbeat_interval_seconds
        limit = self.rt.settings.lap_time_limit_seconds
        while not self._stopped.wait(interval / 4):
            now = time.monotonic()
            with self.lock:
                due = [hb for hb in self.laps if hb.state == "ok" and now - hb.renewed >= interval]
            renew = []
            for hb in due:
                if now - hb.started > limit:
                    log.warning("lap %s of %s ran past %.0f s: its lease is left to expire",
                                hb.lap, hb.run_id, limit)
                    hb.state = "lost"  # check() stops the lap at its next step
                    continue
                renew.append(hb)
            if renew:
                self._renew(renew)

    def _renew(self, laps: list[Heartbeat]) -> None:
        """Every due lap in one statement (``Store.renew_leases``): a busy
        threads worker holds hundreds of laps past the interval at once, and
        one transaction each was load that grew with the load."""
        s = self.rt.settings
        try:
            states = self.rt.store.renew_leases(
                [(hb.run_id, hb.lap, hb.owner) for hb in laps], now=self.rt.clock.now(),
                lease_seconds=s.lease_ttl_seconds)
        except Exception as e:  # the database may be restarting; keep trying
            log.warning("heartbeat for %d laps failed: %s", len(laps), e)
            return
        renewed = time.monotonic()
        for hb in laps:
            hb.renewed = renewed
            hb.state = states.get(hb.owner, "lost")


_start_lock = threading.Lock()


def _beater(rt: Runtime) -> _Beater:
    """The runtime's beater thread in this process (a forked child starts its
    own: threads do not survive fork)."""
    with _start_lock:
        beater = rt.heartbeat
        if not isinstance(beater, _Beater) or beater.pid != os.getpid():
            beater = _Beater(rt)
            rt.heartbeat = beater
        return beater
