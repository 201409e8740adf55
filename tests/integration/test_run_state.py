"""Issue 18 through real ``celery -A tasks worker`` processes: an agent writes
its plan and facts lap by lap, a pool child is killed mid-run, and an
operator's ``update_state`` races a lap in flight."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select

from agent_worker.api import AgentWorker
from store.sql import SqlStore
from store.state import state_edits
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration


def test_plan_progress_kills_and_a_racing_state_edit(aw: AgentWorker, fleet: Fleet) -> None:
    fleet.worker(concurrency=1, AGENT_WORKER_FAULTS="after_model_journal*1")
    fleet.beat()
    run = aw.start_run("planner", {"laps": 10, "pause": 0.4, "goal": "ship"},
                       labels={"suite": "run-state"})
    seen: list[int] = []

    def progressed() -> bool:
        state = aw.get_state(run.id)
        done = sum(p.done for p in state.plan)
        if not seen or seen[-1] != done:
            seen.append(done)
        return done >= 3 and state.status == "running"

    wait_for(progressed, timeout=90, interval=0.05, what="a lap in flight after step 3")
    in_flight = aw.get_run(run.id).next_lap
    edit = aw.update_state(run.id, facts={"operator": "ops"}, note="hurry up")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert seen == sorted(seen) and seen[-1] >= 3, "the plan only progresses"
    final = aw.get_state(run.id)
    assert all(p.done for p in final.plan) and len(final.plan) == 8
    assert final.facts["goal"] == "ship", "pinned at lap 1, kept through compaction"
    assert final.facts["operator"] == "ops"
    store = aw.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        (applied,) = c.execute(select(state_edits.c.applied_lap).where(
            state_edits.c.id == edit.id)).scalars()
    assert applied is not None and applied >= in_flight
    assert "operator" not in aw.state_at(run.id, applied - 1).facts
    assert Counter(e.kind for e in aw.events(run.id))["state_updated"] == 1
    notes = [m for m in aw.messages(run.id)
             if (m.message.meta or {}).get("operator_note") == edit.id]
    assert [(m.lap, m.message.role) for m in notes] == [(applied, "user")]
    assert "hurry up" in notes[0].message.content
    assert [r.id for r in aw.search_runs(labels={"suite": "run-state"}).runs] == [run.id]
