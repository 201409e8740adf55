"""The threads pool (IO-bound fleets): many laps in one worker process, each
committed once, and a SIGKILLed worker's laps resumed by another worker."""

from __future__ import annotations

import signal

import pytest

from agent_worker.api import AgentWorker
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration


def test_threads_pool_runs_laps_at_once_and_survives_a_worker_kill(aw: AgentWorker,
                                                                   fleet: Fleet) -> None:
    first = fleet.worker(concurrency=6, AGENT_WORKER_WORKER_POOL="threads")
    fleet.beat()
    runs = [aw.start_run("loop", {"laps": 6, "pause": 0.4}) for _ in range(6)]
    # Laps of several runs in flight at once, all in the worker's own process.
    wait_for(lambda: sum(aw.get_run(r.id).status == "running" for r in runs) >= 3,
             timeout=60, what="three laps in flight at once")
    leases = [aw.get_run(r.id).lease_owner for r in runs]
    owners = {int(owner.split(":")[1]) for owner in leases if owner}
    assert owners == {first.pid} and first.children() == [], owners
    first.kill(signal.SIGKILL)
    fleet.worker(concurrency=6, AGENT_WORKER_WORKER_POOL="threads")
    for r in runs:
        done = aw.wait(r.id, timeout=120)
        assert done.status == "succeeded", done.error_detail
        assert_laps_exactly_once(aw, r.id, 6)
