"""Recovery does not depend on which worker sweeps: in a fleet where a worker
has not registered a run's agent (mid-deploy, or per-agent worker pools), a
lap lost with its worker is back within the documented bound (lease TTL +
sweep interval, plus the lap itself), even when every sweep lands on such a
worker and the fleet admits laps (a cap is in force)."""

from __future__ import annotations

import signal
import time

import pytest

from agent_worker.api import AgentWorker
from agent_worker.tasks.routing import lap_queue
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet, default_timing, lap_holder, wait_for

pytestmark = pytest.mark.integration

TIMING = default_timing()
#: Every process admits (the fleet guide's cap): a sweep on a worker that does
#: not know the run's agent then cannot admit the recovered lap itself.
CAPPED = {"AGENT_WORKER_MAX_LAPS_IN_FLIGHT": "20", **TIMING}
#: A lap of the ``loop`` agent, so the kill lands mid-lap.
PAUSE = 3.0
#: What a worker needs once the lease lapsed and a sweep re-sent the lap
#: (taking the message, claiming, the lap itself), and the lateness of beat and
#: of a busy machine: the bound the test allows on top of lease + sweep.
SLACK = PAUSE + 6.0


# Known bug, seen once in two CI runs: the killed lap was recovered and
# committed within the bound on the other serving worker, but the run's next
# lap was never sent; every later sweep (on the worker without the agent)
# found nothing to re-send, so the run stayed queued. A run left in the
# admission line is admitted only by a process that knows its agent, and here
# none sweeps. Marked so until it is fixed; an XPASS says it held this time.
@pytest.mark.xfail(reason="a run's next lap can wait in the admission line with no process "
                          "that knows its agent sweeping (open bug)", strict=False)
def test_a_worker_without_the_runs_agent_does_not_slow_its_recovery(
        aw: AgentWorker, fleet: Fleet) -> None:
    # Per-agent pools: the ``loop`` workers consume its lap queue only, and
    # every sweep runs on a worker that knows only the demo's agents.
    serving = [fleet.worker(concurrency=1, queues=lap_queue("loop", "1"), **CAPPED)
               for _ in range(2)]
    fleet.worker(concurrency=1, AGENT_WORKER_AGENT_MODULES="agent_worker.demo.refund_desk",
                 **CAPPED)
    fleet.beat(**CAPPED)
    run = aw.start_run("loop", {"laps": 4, "pause": PAUSE})
    victim, lap = wait_for(lambda: lap_holder(aw, run.id, serving), timeout=60, interval=0.05,
                           what="the run's lap in flight on a serving worker")
    time.sleep(PAUSE / 3)  # mid-lap
    killed = time.monotonic()
    victim.kill(signal.SIGKILL)
    wait_for(lambda: aw.get_run(run.id).lap > lap, timeout=120, interval=0.1,
             what=f"lap {lap} to commit on the other serving worker")
    took = time.monotonic() - killed
    bound = (float(TIMING["AGENT_WORKER_LEASE_TTL_SECONDS"])
             + float(TIMING["AGENT_WORKER_SWEEP_INTERVAL_SECONDS"]) + SLACK)
    assert took < bound, f"lap {lap} committed {took:.1f}s after the kill (bound {bound:.0f}s)"
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 4)
    assert done.recoveries == 1
