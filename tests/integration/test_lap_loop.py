"""The durable lap loop through real ``celery -A agent_worker.tasks worker`` processes."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from agent_worker.api import AgentWorker
from agent_worker.demo.vendor import start_vendor
from tests.support import TEST_POOL, Fleet, wait_for

pytestmark = pytest.mark.integration


def assert_laps_exactly_once(aw: AgentWorker, run_id: str, laps: int) -> None:
    """Checkpoints 0..laps with no gap, one commit event per lap, no duplicate message."""
    assert [c[0] for c in aw.checkpoints(run_id)] == list(range(laps + 1))
    commits = Counter(e.lap for e in aw.events(run_id) if e.kind == "lap_committed")
    assert commits == Counter(range(1, laps + 1)), commits
    msgs = aw.messages(run_id)
    assert [m.seq for m in msgs] == list(range(len(msgs)))
    results = Counter((m.lap, m.message.tool_call_id) for m in msgs if m.message.role == "tool")
    assert all(n == 1 for n in results.values()), "a tool result was written twice"


def test_thirty_lap_run_completes_through_workers(aw: AgentWorker, fleet: Fleet) -> None:
    fleet.worker(concurrency=2)
    run = aw.start_run("loop", {"laps": 30})
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert done.result == {"laps": 30}
    assert_laps_exactly_once(aw, run.id, 30)
    # Lap k wrote exactly its assistant message and one tool result.
    per_lap = Counter(m.lap for m in aw.messages(run.id))
    assert per_lap == Counter({0: 1, **{k: 2 for k in range(1, 30)}, 30: 1})


def test_demo_run_completes(aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    with start_vendor(tmp_path / "vendor.db") as vendor:
        fleet.worker(concurrency=2, AGENT_WORKER_VENDOR_URL=vendor.url)
        run = aw.start_run("refund-desk", {})
        done = aw.wait(run.id, timeout=120)
        assert done.status == "succeeded", done.error_detail
        assert_laps_exactly_once(aw, run.id, done.lap)
        assert done.lap == 20
        stats = vendor.client.stats()
        assert stats["refunds"] == 6 and stats["notices"] == 6 and stats["duplicates"] == 0
        assert done.result["total_cents"] == stats["total_cents"]


@pytest.mark.skipif(TEST_POOL == "threads",
                    reason="a threads worker has no pool child: the fault kills the whole "
                    "worker, which test_whole_worker_sigkilled_mid_lap and the chaos suite cover")
@pytest.mark.parametrize("point", ["after_model_journal", "after_commit"])
def test_pool_child_killed_at_fault_point(aw: AgentWorker, fleet: Fleet, point: str) -> None:
    """SIGKILL inside the lap (after the model output is journaled) and between
    commit and enqueue: the run completes and every lap commits once."""
    fleet.worker(concurrency=2, AGENT_WORKER_FAULTS=f"{point}*3")
    fleet.beat()
    run = aw.start_run("loop", {"laps": 12})
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 12)
    faults = Path(fleet.env["AGENT_WORKER_FAULT_DIR"])
    assert len(list(faults.glob(f"{point}.*"))) == 3, "the fault points never fired"


def test_whole_worker_sigkilled_mid_lap(aw: AgentWorker, fleet: Fleet) -> None:
    """A node loss: the worker and its pool die at once; another worker resumes
    the run after the lease TTL plus a sweep, not after Redis's visibility timeout."""
    first = fleet.worker(concurrency=1)
    fleet.beat()
    run = aw.start_run("loop", {"laps": 8, "pause": 1.0})
    wait_for(lambda: aw.get_run(run.id).lap >= 2, timeout=60, what="two laps")
    wait_for(lambda: aw.get_run(run.id).status == "running", timeout=10, what="a lap in flight")
    killed_at = time.monotonic()
    first.kill(signal.SIGKILL)
    lap_at_kill = aw.get_run(run.id).lap
    fleet.worker(concurrency=1)
    wait_for(lambda: aw.get_run(run.id).lap > lap_at_kill, timeout=60, what="recovery")
    recovery = time.monotonic() - killed_at
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 8)
    assert done.recoveries >= 1
    assert recovery < 30, f"recovery took {recovery:.1f}s"


def test_duplicate_lap_message_commits_once(aw: AgentWorker, fleet: Fleet) -> None:
    """Two workers handed the same lap at once: one claims, the other skips."""
    from agent_worker.store.base import DueLap
    from agent_worker.tasks.dispatch import CeleryDispatcher

    fleet.worker(concurrency=1)
    fleet.worker(concurrency=1)
    run = aw.start_run("loop", {"laps": 4, "pause": 1.5})
    dup = DueLap(run.id, 1, "loop", "1")
    for _ in range(3):
        CeleryDispatcher().send(dup)
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded"
    assert_laps_exactly_once(aw, run.id, 4)


def test_start_run_with_same_id_creates_one_run(aw: AgentWorker, fleet: Fleet) -> None:
    fleet.worker(concurrency=1)
    first = aw.start_run("loop", {"laps": 2}, run_id="same-id-1")
    second = aw.start_run("loop", {"laps": 2}, run_id="same-id-1")
    assert first.id == second.id
    assert len([r for r in aw.list_runs(agent="loop", limit=1000) if r.id == "same-id-1"]) == 1
    assert aw.wait("same-id-1", timeout=60).status == "succeeded"
    assert_laps_exactly_once(aw, "same-id-1", 2)

