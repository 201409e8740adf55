"""Child runs in the in-process engine on both dialects:
results and errors reach the parent's model in order, children start exactly
once across a replayed lap, the wake-up cannot be lost (a child ending before
the parent pauses, two children ending at once), the children's spend is
charged to the parent, limits hold, and cancelling a parent cancels its
children with their compensations."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

import tests.child_agents  # noqa: F401  (registers fan and kid)
from agent_worker.cli.tree import render_tree, run_tree
from agent_worker.core.errors import ChildLimitError, InvalidStateError
from agent_worker.engine import children
from agent_worker.engine.calls import CallRunner
from agent_worker.engine.lap import run_lap
from agent_worker.engine.newrun import admitted_run
from agent_worker.inprocess import InProcessWorker
from agent_worker.store.base import RunUpdate
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from tests.child_agents import CALLS


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url)
    yield worker
    worker.close()


def _store(w: InProcessWorker) -> SqlStore:
    assert isinstance(w.rt.store, SqlStore)
    return w.rt.store


def _told(w: InProcessWorker, run_id: str) -> dict[str, Any]:
    """What the parent's model was told by ``spawn`` (the fan echoes it)."""
    run = w.get_run(run_id)
    assert run.status == "succeeded", (run.status, run.error_message)
    told: dict[str, Any] = run.result
    return told


def _events(w: InProcessWorker, run_id: str, kind: str) -> list[Any]:
    return [e for e in w.events(run_id) if e.kind == kind]


def test_fan_out_and_in_with_a_failing_child(w: InProcessWorker) -> None:
    parent = w.start_run("fan", {"n": 5, "fail_at": 3})
    w.run_until_idle()
    told = _told(w, parent.id)["children"]
    key = f"{parent.id}:1:0"
    assert [c["run_id"] for c in told] == [f"{key}:{i}" for i in range(5)]
    assert [c["status"] for c in told] == ["succeeded"] * 3 + ["failed", "succeeded"]
    assert told[0]["result"] == {"double": 0} and told[4]["result"] == {"double": 8}
    assert told[3]["error"]["code"] == "model_refusal"
    assert "kid 3 refuses" in told[3]["error"]["message"]
    kids = w.list_runs(parent=parent.id)
    assert sorted(k.id for k in kids) == [f"{key}:{i}" for i in range(5)]
    assert all(k.tenant == parent.tenant for k in kids)
    # Woken exactly once, by the last child's end.
    assert len(_events(w, parent.id, "woken")) == 1
    # `runs show` prints the tree from both ends.
    tree = run_tree(w.rt.store, parent.id)
    assert tree["parent"] is None and tree["total"] == 5
    assert tree["counts"] == {"succeeded": 4, "failed": 1}
    assert [k["id"] for k in tree["children"]] == [c["run_id"] for c in told]
    assert render_tree(parent.id, tree) is not None
    leaf = run_tree(w.rt.store, told[0]["run_id"])
    assert (leaf["parent"], leaf["depth"], leaf["total"]) == (parent.id, 1, 0)


def test_children_spend_is_charged_to_the_parent_and_split_from_its_budget(
        w: InProcessWorker) -> None:
    from agent_worker.core.budget import Budget

    parent = w.start_run("fan", {"n": 4}, budget=Budget(max_output_tokens=1000))
    w.run_until_idle()
    done = w.get_run(parent.id)
    kids = w.list_runs(parent=parent.id)
    assert len(kids) == 4 and all(k.status == "succeeded" for k in kids)
    # Each kid got an even share of what the parent had left before its lap.
    assert {k.limits["max_output_tokens"] for k in kids} == {1000 // 4}
    # The parent's own two model calls plus every child's one.
    assert done.input_tokens == 2 * 100 + sum(k.input_tokens for k in kids) == 600
    assert done.output_tokens == 2 * 20 + 4 * 20
    state = w.state_at(parent.id, done.lap)
    assert state.budget.output_tokens == done.output_tokens


class _Crash(BaseException):
    """The worker dies (the lap stops where it is; nothing is released)."""


def test_a_replayed_lap_finds_the_children_it_started(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    real_finish = CallRunner._finish
    crashed: list[str] = []

    def finish_then_die(self: CallRunner, key: str, status: Any, result: Any,
                        error: str | None = None) -> None:
        if children.is_marker(result) and not crashed:
            crashed.append(key)  # the children are started; their outcome never recorded
            raise _Crash
        real_finish(self, key, status, result, error)

    monkeypatch.setattr(CallRunner, "_finish", finish_then_die)
    CALLS.clear()
    parent = w.start_run("fan", {"n": 3})
    with pytest.raises(_Crash):
        w.run_until_idle()
    # The dead worker's lease lapses; the sweeper hands the lap to another.
    past = datetime.now(UTC) - timedelta(hours=1)
    with _store(w).engine.begin() as c:
        c.execute(update(runs).where(runs.c.id == parent.id).values(lease_expires_at=past))
    w.queue.pending.clear()  # the dead worker's sends: the sweep re-sends what is due
    w.run_until_idle()
    assert [c for c in CALLS if c[0] == "spawn"] == [("spawn", crashed[0])] * 2
    kids = w.list_runs(parent=parent.id)
    assert len(kids) == 3
    for kid in kids:
        assert len(_events(w, kid.id, "run_created")) == 1
        assert len(_events(w, kid.id, "lap_committed")) == 1
    assert [c["result"] for c in _told(w, parent.id)["children"]] == [
        {"double": 0}, {"double": 2}, {"double": 4}]


def test_a_child_that_ends_before_the_parent_pauses_is_not_missed(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The children end between the parent's look at them and its commit of
    the wait: the commit's recheck finds them (else the parent waits forever)."""
    real_outcome = children.outcome

    def look_then_let_them_finish(rt: Any, marker: dict[str, Any]) -> Any:
        seen = real_outcome(rt, marker)
        kids = [lap for lap in list(w.queue.pending) if lap.agent_name == "kid"]
        for lap in kids:
            w.queue.pending.remove(lap)
            run_lap(rt, lap.run_id, lap.lap)
        return seen

    monkeypatch.setattr(children, "outcome", look_then_let_them_finish)
    parent = w.start_run("fan", {"n": 2})
    w.queue.pending.clear()
    run_lap(w.rt, parent.id, 1)
    monkeypatch.setattr(children, "outcome", real_outcome)
    assert w.get_run(parent.id).status == "queued"  # not "waiting": the commit saw them
    w.run_until_idle()
    assert [c["status"] for c in _told(w, parent.id)["children"]] == ["succeeded"] * 2


def _end_at_once(w: InProcessWorker, kid: str, barrier: threading.Barrier,
                 errors: list[BaseException]) -> None:
    """End ``kid`` (claimed by ``o-<kid>``) as soon as its sibling is ready too."""
    try:
        barrier.wait()
        assert w.rt.store.release(
            kid, 1, owner=f"o-{kid}", now=w.rt.clock.now(),
            outcome=RunUpdate(status="succeeded", result={"double": 0}),
            event={"kind": "finished"})
    except BaseException as e:  # reported by the test
        errors.append(e)


@pytest.mark.parametrize("rounds", [6])
def test_two_children_ending_at_once_wake_the_parent_exactly_once(
        w: InProcessWorker, rounds: int) -> None:
    for _ in range(rounds):
        parent = w.start_run("fan", {"n": 2})
        w.queue.pending.clear()
        run_lap(w.rt, parent.id, 1)
        assert w.get_run(parent.id).status == "waiting"
        w.queue.pending.clear()
        kids = sorted(k.id for k in w.list_runs(parent=parent.id))
        now = w.rt.clock.now()
        claims = [w.rt.store.claim(k, 1, owner=f"o-{k}", now=now, lease_seconds=30,
                                   window_messages=10) for k in kids]
        assert all(claims)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_end_at_once, args=(w, k, barrier, errors))
                   for k in kids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert w.get_run(parent.id).status == "queued"
        assert len(_events(w, parent.id, "woken")) == 1


def test_wait_any_resumes_on_the_first_child(w: InProcessWorker) -> None:
    parent = w.start_run("fan", {"n": 3, "wait": "any"})
    w.queue.pending.clear()
    run_lap(w.rt, parent.id, 1)
    kids = sorted(w.queue.pending, key=lambda lap: lap.run_id)
    w.queue.pending.clear()
    run_lap(w.rt, kids[1].run_id, 1)
    assert w.get_run(parent.id).status == "queued"
    run_lap(w.rt, parent.id, 2)
    run_lap(w.rt, parent.id, 3)
    told = _told(w, parent.id)
    assert [c["run_id"] for c in told["children"]] == [kids[1].run_id]
    assert told["still_running"] == [kids[0].run_id, kids[2].run_id]


def test_limits_come_back_to_the_model_as_a_tool_error(dialect_url: str) -> None:
    w = InProcessWorker(dialect_url, max_children_per_call=3)
    try:
        parent = w.start_run("fan", {"n": 4})
        w.run_until_idle()
        run = w.get_run(parent.id)
        assert run.status == "succeeded"
        assert "MAX_CHILDREN_PER_CALL" in str(run.result)
        assert w.list_runs(parent=parent.id) == []
    finally:
        w.close()


def test_depth_limit(dialect_url: str) -> None:
    w = InProcessWorker(dialect_url, max_child_depth=1)
    try:
        parent = w.start_run("fan", {"n": 1, "hold": True})
        w.run_until_idle()
        kid = w.list_runs(parent=parent.id)[0]
        assert kid.status == "waiting"
        with pytest.raises(ChildLimitError, match="depth 2"):
            w.start_child(kid.id, "kid", {"n": 1}, key="grandchild")
    finally:
        w.close()


def test_cancelling_the_parent_cancels_its_children_with_compensations(
        w: InProcessWorker) -> None:
    CALLS.clear()
    parent = w.start_run("fan", {"n": 3, "hold": True})
    w.run_until_idle()
    kids = w.list_runs(parent=parent.id)
    assert {k.status for k in kids} == {"waiting"}  # each reserved, then waits for "go"
    w.cancel(parent.id, reason="not needed")
    w.run_until_idle()
    assert w.get_run(parent.id).status == "cancelled"
    for kid in w.list_runs(parent=parent.id):
        assert kid.status == "cancelled"
        assert parent.id in (kid.cancel_reason or "")
    released = sorted(k for what, k in CALLS if what == "release")
    assert released == sorted(f"{k.id}:1:0:undo" for k in kids)


def test_start_child_from_the_api_is_keyed(w: InProcessWorker) -> None:
    parent = w.start_run("fan", {"n": 1, "hold": True})
    w.run_until_idle()
    one = w.start_child(parent.id, "kid", {"n": 7}, key="extra")
    again = w.start_child(parent.id, "kid", {"n": 7}, key="extra")
    assert one.id == again.id
    assert len(w.list_runs(parent=parent.id)) == 2
    assert _store(w).child_link(one.id) is not None
    w.run_until_idle()
    assert w.get_run(one.id).result == {"double": 14}
    # A start racing a cancel: the store re-checks under the parent's row lock.
    due = w.rt.store.request_cancel(parent.id, reason="done", by="ops", now=w.rt.clock.now())
    w.rt.send_all([due] if due else [])
    late = admitted_run(w.rt, w.rt.registry.get("kid"), {"n": 8}, run_id="late-kid",
                   tenant=None, limits=w.rt.registry.get("kid").budget)
    with pytest.raises(InvalidStateError, match="being cancelled"):
        _store(w).start_children(parent.id, f"{parent.id}:api:late", [late],
                                 now=w.rt.clock.now(), owner=None, max_depth=4,
                                 max_per_run=10)
    w.run_until_idle()
    with pytest.raises(InvalidStateError):
        w.start_child(parent.id, "kid", {"n": 8}, key="late")
    assert json.dumps(w.get_run(parent.id).status) == '"cancelled"'
