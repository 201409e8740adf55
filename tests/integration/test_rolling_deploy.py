"""A rolling deploy with runs in flight, through real workers of version 1 and
version 2: once version 2 migrated a run, every later lap
runs on version 2 (its laps go to version 2's queue, and a version-1 worker
cannot claim it), and no lap runs twice."""

from __future__ import annotations

import pytest

from agent_worker.api import AgentWorker
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration

RUNS, LAPS = 4, 40


def test_after_migration_every_lap_runs_on_the_new_version(
        aw: AgentWorker, fleet: Fleet) -> None:
    old = fleet.worker(concurrency=2, AGENT_WORKER_TEST_ROLLING="1")
    fleet.beat()
    ids = [aw.start_run("rolling", {"laps": LAPS, "pause": 0.2}, version="1").id
           for _ in range(RUNS)]
    wait_for(lambda: all(aw.get_run(i).lap >= 2 for i in ids), timeout=60,
             what="every run under way on version 1")
    fleet.worker(concurrency=2, AGENT_WORKER_TEST_ROLLING="2")
    # Both versions serve laps side by side for a while, then the old one goes.
    wait_for(lambda: any(aw.state_at(i, aw.get_run(i).lap).agent_version == "2" for i in ids),
             timeout=60, what="a first checkpoint written by version 2")
    before = {i: aw.get_run(i).lap for i in ids}
    wait_for(lambda: all(r.finished or r.lap >= before[r.id] + 8
                         for r in map(aw.get_run, ids)), timeout=90,
             what="both versions side by side for 8 laps of every run")
    assert old.alive()
    old.stop()
    migrated = 0
    for run_id in ids:
        done = aw.wait(run_id, timeout=90)
        assert done.status == "succeeded", done.error_detail
        assert_laps_exactly_once(aw, run_id, done.lap)
        said = [m.message.content.split()[0] for m in aw.messages(run_id)
                if m.message.role == "assistant"]
        versions = [aw.state_at(run_id, lap).agent_version for lap in range(done.lap + 1)]
        assert versions == sorted(versions), f"version ping-pong: {versions}"
        if "v2" not in said:
            continue  # finished on version 1 before version 2 took one of its laps
        migrated += 1
        assert set(said[said.index("v2"):]) == {"v2"}, f"version ping-pong: {said}"
        assert done.agent_version == "2"
        assert aw.state_at(run_id, done.lap).facts["migrated_from"] == "1"
    assert migrated >= 1
