"""Time and hand-offs through real workers.

- Worker clocks minutes apart steal no lease: ownership is decided on the
  database's clock.
- A lap lost with its message (the worker killed between its commit and its
  send) is re-sent about one lease TTL later, with the default settings, not
  after ``queued_overdue_seconds``.
- Sweeps never pile messages onto the queue of a version no worker serves.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from agent_worker.agent import register, registry
from agent_worker.api import AgentWorker
from agent_worker.core.constants import MAINT_QUEUE
from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.metrics import registry_for
from agent_worker.store.rows import served_versions
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.routing import lap_queue
from tests.agents import OffsetClock
from tests.conftest import DatabaseClock
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.store_helpers import end_unfinished_runs
from tests.support import Fleet, default_timing

pytestmark = pytest.mark.integration

#: The default timing settings: the short ones of ``worker_env`` hid a slow recovery.
DEFAULT_TIMING = default_timing()

#: An agent only this test process knows: no worker serves it.
UNSERVED = register(replace(registry.get("loop"), name="nobody-serves-this"))


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[VendorProcess]:
    with start_vendor(tmp_path / "vendor.db") as v:
        yield v


def test_worker_clocks_minutes_apart_steal_no_lease(aw: AgentWorker, fleet: Fleet,
                                                    vendor: VendorProcess,
                                                    tmp_path: Path) -> None:
    """One worker 5 minutes ahead, one 5 minutes behind (an offset clock each),
    a beat on true time: every lap runs once (first attempt), nothing is
    recovered, no vendor call is repeated."""
    env = {"AGENT_WORKER_VENDOR_URL": vendor.url}
    for name, minutes in (("ahead", 5), ("behind", -5)):
        clock = OffsetClock(tmp_path / name)
        clock.advance(minutes=minutes)
        fleet.worker(concurrency=2, AGENT_WORKER_TEST_CLOCK_FILE=clock.path, **env)
    fleet.beat(**env)
    loops = [aw.start_run("loop", {"laps": 5, "pause": 0.8}).id for _ in range(6)]
    paid = [aw.start_run("payments", {"payments": 3}).id for _ in range(2)]
    for run_id, laps in [*((r, 5) for r in loops), *((r, 4) for r in paid)]:
        done = aw.wait(run_id, timeout=120)
        assert done.status == "succeeded", done.error_detail
        assert_laps_exactly_once(aw, run_id, laps)
        events = aw.events(run_id)
        attempts = [e.data["attempt"] for e in events if e.kind == "lap_committed" and e.data]
        assert attempts == [1] * laps, f"a lap of {run_id} ran more than once: {attempts}"
        assert not [e for e in events if e.kind == "recovered"], "a live lease was recovered"
        assert aw.get_run(run_id).recoveries == 0
    by_key = vendor.client.stats()["by_key"]
    assert len(by_key) == 6 and set(by_key.values()) == {1}


def test_a_sleep_set_by_a_worker_minutes_ahead_lasts_its_length(aw: AgentWorker, fleet: Fleet,
                                                                 tmp_path: Path) -> None:
    """A sleep's wake time is computed on the database's clock too: a worker
    5 minutes ahead does not turn a 3 s sleep into 5 minutes."""
    clock = OffsetClock(tmp_path / "ahead")
    clock.advance(minutes=5)
    # The skewed worker runs the laps; the sweeps run on a worker with a true clock.
    fleet.worker(concurrency=1, queues=lap_queue("pauses", "1"),
                 AGENT_WORKER_TEST_CLOCK_FILE=clock.path)
    fleet.worker(concurrency=1, queues=MAINT_QUEUE)
    fleet.beat()
    run = aw.start_run("pauses", {"plan": [["sleep", {"seconds": 3}]]})
    done = aw.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 3)  # sleep, wake, answer
    # Each worker recorded what it really consumes: the maint-only one, nothing.
    assert isinstance(aw.rt.store, SqlStore)
    laps, maint = (f"w{n}-{os.getpid()}@{socket.gethostname()}" for n in (1, 2))
    with aw.rt.store.engine.connect() as c:
        rows = c.execute(select(served_versions.c.worker, served_versions.c.agent_name,
                                served_versions.c.agent_version)
                         .where(served_versions.c.worker.in_([laps, maint]))).all()
    assert {tuple(r) for r in rows} == {(laps, "pauses", "1")}


def test_a_lap_lost_between_commit_and_send_is_resent_after_the_lease_ttl(
        aw: AgentWorker, fleet: Fleet) -> None:
    """Default settings (lease TTL 10 s, queued_overdue_seconds 60 s): the pool
    child dies right after committing lap 1, so lap 2's message is never sent.
    The hand-off expires like a lease: the run goes on well before 60 s."""
    fleet.worker(concurrency=1, AGENT_WORKER_FAULTS="after_commit", **DEFAULT_TIMING)
    fleet.beat(**DEFAULT_TIMING)
    run = aw.start_run("loop", {"laps": 3})
    started = time.monotonic()
    done = aw.wait(run.id, timeout=45)
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 3)
    assert time.monotonic() - started < 45


def test_sweeps_never_grow_the_queue_of_a_version_nobody_serves(
        aw: AgentWorker, tmp_path: Path, db_clock: DatabaseClock, broker_url: str,
        database_url: str) -> None:
    """500 runs of a version no worker serves, 30 simulated minutes of sweeps
    (one every 30 s): the queue holds the 500 first sends and nothing more,
    Redis memory stays flat, and the metrics say these runs wait for a worker."""
    clock = OffsetClock(tmp_path / "clock")
    aw.rt.clock = clock
    queue = lap_queue(UNSERVED.name, UNSERVED.version)
    r = redis.Redis.from_url(broker_url)
    r.delete(queue)
    # Runs earlier tests left runnable in this session's database are not the
    # subject: ended here, so the sweeps below could only re-send these 500.
    end_unfinished_runs(database_url)
    before = r.info("memory")["used_memory"]
    for _ in range(500):
        aw.start_run(UNSERVED)
    assert r.llen(queue) == 500
    sent = 0
    for _ in range(60):
        clock.advance(seconds=30)
        db_clock.advance(seconds=30)
        sent += aw.sweep()
    assert sent == 0 and r.llen(queue) == 500
    # Redis holds the first sends and nothing that grows with the sweeps.
    assert r.info("memory")["used_memory"] - before < 4 * 2**20
    assert Counter(run.status for run in aw.list_runs(agent=UNSERVED.name,
                                                      limit=1000)) == {"queued": 500}
    # ...and the exporter says who is waiting for a worker (the alert's input).
    assert isinstance(aw.rt.store, SqlStore)
    scrape = registry_for(aw.rt.store, aw.rt.settings)
    assert scrape.get_sample_value("agent_worker_unserved_runs", {
        "agent": UNSERVED.name, "version": UNSERVED.version}) == 500
    r.delete(queue)
    r.close()
