"""Issue 18 through real ``celery -A agent_worker.tasks worker`` processes: an agent writes
its plan and facts over 30 laps while whole workers are SIGKILLed mid-lap and
an operator's ``update_state`` races a lap in flight; every lap's state is
exactly what that lap wrote."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from sqlalchemy import select

from agent_worker.api import AgentWorker
from agent_worker.store.sql import SqlStore
from agent_worker.store.state import state_edits
from tests.conftest import DatabaseClock
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet, Proc, lease_holder, wait_for

pytestmark = pytest.mark.integration

LAPS = 30
EDIT_AT = 4
KILL_AT = (10, 18, 25)


def test_state_of_thirty_laps_through_kills_and_a_racing_edit(
        aw: AgentWorker, fleet: Fleet, db_clock: DatabaseClock) -> None:
    """The state tools' writes survive whole-worker SIGKILLs: each lap in
    ``KILL_AT`` is killed mid-way (in its slow step, its state writes made but
    not committed) with the worker that holds its lease, and a new worker is
    started. The run ends with, at every lap, exactly the plan progress and
    ``trail`` fact that lap wrote on top of the one before: no update lost (a
    gap) or applied twice (a repeat). An operator's edit made while lap
    ``EDIT_AT`` runs lands at a later lap boundary, once.

    Laps are fast except the slow ones, which are caught by polling the run
    row, not by timed sleeps. Instead of waiting out a dead worker's lease
    (3 s here), the database clock jumps past it: recovery takes the real path
    (the sweeper or a redelivery claims the lapsed lease, a survivor runs it)."""
    workers: list[Proc] = [fleet.worker(concurrency=1) for _ in range(3)]
    fleet.beat()
    run = aw.start_run("planner", {"laps": LAPS, "pause": 0.8, "goal": "ship",
                                   "slow_laps": [EDIT_AT, *KILL_AT]},
                       labels={"suite": "run-state"})
    progress: list[int] = []

    def in_flight(lap: int) -> Proc:
        def holder() -> Proc | None:
            now = aw.get_run(run.id)
            progress.append(sum(p.done for p in aw.get_state(run.id).plan))
            return lease_holder(now.lease_owner, workers) if now.next_lap == lap else None

        found: Proc = wait_for(holder, timeout=90, interval=0.05,
                               what=f"lap {lap} in flight on a worker")
        return found

    in_flight(EDIT_AT)
    edit = aw.update_state(run.id, facts={"operator": "ops"}, note="hurry up")
    for lap in KILL_AT:
        victim = in_flight(lap)
        time.sleep(0.2)  # into the slow step
        victim.kill(signal.SIGKILL)
        workers = [w for w in workers if w is not victim] + [fleet.worker(concurrency=1)]
        db_clock.advance(seconds=4)  # the dead worker's lease (TTL 3 s) has lapsed
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert done.result == {"laps": LAPS}
    assert progress == sorted(progress) and progress[-1] >= KILL_AT[-1] - 2, "only progresses"
    assert_laps_exactly_once(aw, run.id, LAPS)

    store = aw.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        (applied,) = c.execute(select(state_edits.c.applied_lap).where(
            state_edits.c.id == edit.id)).scalars()
    assert applied is not None and applied >= EDIT_AT
    for lap in range(1, LAPS):
        state = aw.state_at(run.id, lap)
        assert [p.done for p in state.plan] == [i < lap - 1 for i in range(LAPS - 2)], lap
        assert state.facts.get("trail", []) == list(range(2, lap + 1)), lap
        assert ("operator" in state.facts) == (lap >= applied), lap
    final = aw.get_state(run.id)
    assert all(p.done for p in final.plan) and final.facts["trail"] == list(range(2, LAPS))
    assert final.facts["goal"] == "ship", "pinned at lap 1, kept through compaction"
    assert Counter(e.kind for e in aw.events(run.id))["state_updated"] == 1
    notes = [m for m in aw.messages(run.id)
             if (m.message.meta or {}).get("operator_note") == edit.id]
    assert [(m.lap, m.message.role) for m in notes] == [(applied, "user")]
    assert "hurry up" in notes[0].message.content
    assert [r.id for r in aw.search_runs(labels={"suite": "run-state"}).runs] == [run.id]
