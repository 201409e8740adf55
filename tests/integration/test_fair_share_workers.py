"""Fair share through real workers: a tenant capped at one lap in
flight; its second run waits in Postgres while the first holds the slot, the
slot of a SIGKILLed worker comes back within lease TTL + one sweep, and the
waiting run is admitted as soon as the slot is handed on. Sampled every
100 ms from the database, the cap is never exceeded."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest

from agent_worker.api import AgentWorker
from agent_worker.store.admitting import THROTTLED
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration


def test_capped_run_waits_and_a_killed_workers_slot_comes_back(aw: AgentWorker,
                                                               fleet: Fleet) -> None:
    tenant = f"fs-{uuid.uuid4().hex[:8]}"
    aw.set_share(tenant, concurrency=1)
    env = {"AGENT_WORKER_SHARE_REFRESH_SECONDS": "0.5"}
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.extend(q.in_flight for q in aw.queues() if q.tenant == tenant)
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        workers = [fleet.worker(concurrency=2, **env) for _ in range(2)]
        fleet.beat(**env)
        sampler.start()
        slow = aw.start_run("loop", {"laps": 2, "pause": 1.5}, tenant=tenant).id
        quick = aw.start_run("loop", {"laps": 1}, tenant=tenant).id
        assert aw.get_run(quick).admitted_lap == THROTTLED
        wait_for(lambda: aw.get_run(slow).status == "running", timeout=60)
        owner = aw.get_run(slow).lease_owner or ""
        holder = next(w for w in workers if int(owner.split(":")[1]) in w.lap_pids())
        holder.kill(signal.SIGKILL)  # the other worker lives on, sweeps and runs laps
        killed = time.monotonic()
        wait_for(lambda: aw.get_run(slow).recoveries >= 1, timeout=30)
        # lease TTL 3 s + sweep 0.5 s, with slack for a loaded machine
        assert time.monotonic() - killed < 3 + 0.5 + 3
        assert aw.get_run(quick).status == "queued"
        done = aw.wait(slow, timeout=60)
        assert done.status == "succeeded"
        assert aw.wait(quick, timeout=30).status == "succeeded"
        # Admitted when the slow run's last lap handed its slot on, not a
        # re-send later.
        started = min(e.created_at for e in aw.events(quick) if e.kind == "lap_committed")
        assert done.finished_at is not None
        assert (started - done.finished_at).total_seconds() < 3
    finally:
        stop.set()
        aw.clear_share(tenant)
    assert seen and max(seen) <= 1
