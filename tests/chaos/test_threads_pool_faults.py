"""A threads-pool worker through a Redis outage: it cannot stop a running lap,
so it does not try (no ``kill_job`` ``NotImplementedError`` per lap at each
connection loss); its laps run on, and every run still finishes with each lap
committed once. Prefork keeps cancelling (tests/chaos/test_faults.py)."""

from __future__ import annotations

import pytest

from agent_worker.api import AgentWorker
from tests.chaos.conftest import PrivateRedis
from tests.chaos.test_faults import _finish_all, _start_loops, _supervised_until_finished
from tests.support import Fleet, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

#: What a connection loss logged under threads while
#: worker_cancel_long_running_tasks_on_connection_loss was on (Celery's
#: consumer.on_connection_error_after_connected), and the notice Celery logs
#: instead when it is off.
NOISE = ("kill_job", "NotImplementedError", "Failed to cancel active request",
         "cannot be acknowledged after a connection loss",
         "In Celery 5.1 we introduced an optional breaking change")


def test_threads_worker_rides_out_a_redis_outage_quietly(
        aw: AgentWorker, fleet: Fleet, private_redis: PrivateRedis) -> None:
    fleet.env["AGENT_WORKER_WORKER_POOL"] = "threads"  # restarted workers too
    workers = [fleet.worker(concurrency=3)]
    fleet.beat()
    laps = 8
    ids = _start_loops(aw, 3, laps=laps, pause=1.0)
    # Laps in flight when Redis goes: each used to be "cancelled" (and fail to be).
    wait_for(lambda: sum(aw.get_run(r).status == "running" for r in ids) >= 2
             and all(aw.get_run(r).lap >= 1 for r in ids), timeout=120,
             what="laps of every run in flight")
    private_redis.restart(down_seconds=3)
    _supervised_until_finished(aw, fleet, workers, ids)
    _finish_all(aw, ids, laps)
    worker_logs = "\n".join(p.log.read_text(errors="replace") for p in fleet.procs
                            if p.log.exists() and p.log.name.startswith("worker"))
    assert "Connection to broker lost" in worker_logs, "the worker never saw the outage"
    noisy = [line for line in worker_logs.splitlines() if any(n in line for n in NOISE)]
    assert not noisy, "\n".join(noisy[:20])
