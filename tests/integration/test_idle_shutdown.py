"""Stopping an idle worker as deploy/ does (SIGTERM remapped to SIGQUIT, a
soft-shutdown timeout): it leaves at once, since no lap needs the timeout.
A worker with a lap in flight keeps the soft shutdown (the lap handed back or
finished): tests/chaos/test_faults.py::test_warm_shutdown_hands_the_lap_back_promptly."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_an_idle_worker_leaves_without_waiting_for_the_soft_timeout(fleet: Fleet,
                                                                    pool: str) -> None:
    soft = 30.0
    # Idle means nothing to take: a sweep message an earlier test's beat left in
    # this xdist worker's broker database would keep it busy at its start (and
    # then Celery's soft shutdown sleeps its whole timeout, as designed).
    with redis.Redis.from_url(fleet.env["AGENT_WORKER_BROKER_URL"]) as broker:
        broker.flushdb()
    worker = fleet.worker(concurrency=2, REMAP_SIGTERM="SIGQUIT", AGENT_WORKER_WORKER_POOL=pool,
                          AGENT_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS=str(soft))
    wait_for(lambda: " ready." in worker.log.read_text(errors="replace"), 60,
             what="the worker ready")
    sent = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)  # the platform signals the main process only
    assert worker.popen is not None
    worker.popen.wait(timeout=soft + 30)
    took = time.monotonic() - sent
    log = worker.log.read_text(errors="replace")
    print(f"idle {pool} worker left {took:.1f}s after SIGTERM")
    # Idle, it leaves in about a second or two; a bound well above that, still
    # far below the timeout it used to sleep through.
    assert took < soft / 2, f"the idle worker took {took:.1f}s to leave\n{log[-3000:]}"
    assert "Cold shutdown" in log, "SIGTERM was not remapped to the soft (cold) shutdown"
    assert "Initiating Soft Shutdown" not in log
