"""The run's state, readable and steerable while it runs, in process on
SQLite and Postgres: state tools and ``ToolContext`` writes land in the lap's
checkpoint once, survive compaction and a replayed lap; ``get_state`` reads
the committed state in the middle of a lap; an operator's
``update_state`` that races a lap in flight is applied by the next lap
boundary, once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from agent_worker import InProcessWorker, ScriptedModel, ToolContext, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.errors import InvalidStateError, StateLimitError, UnknownRunError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.state_toolkit import state_tools
from agent_worker.store.sql import SqlStore
from agent_worker.store.state import state_edits
from tests.principals import acting

SEEN: list[ModelRequest] = []
#: Attempts of the lap that makes progress step N that die after writing the state.
FLAKY: dict[int, int] = {}


@tool
def progress(step: int, ctx: ToolContext) -> str:
    """A read tool that reports progress through its context; fails once when told."""
    ctx.mark_step(step)
    ctx.pin_fact(f"step_{step}", "done")
    if FLAKY.get(step):
        FLAKY[step] -= 1
        raise RuntimeError("worker hiccup after the state write")
    return "ok"


def _script(r: ModelRequest) -> ModelResponse:
    SEEN.append(r)
    if r.lap == 1:
        return turn("planning", [("set_plan", {"steps": ["read", "write", "check"]}),
                                 ("pin_fact", {"key": "customer", "value": "acme-42"}),
                                 ("set_next_action", {"action": "read the file"})])
    if r.lap in (2, 3, 4):
        return turn(f"step {r.lap - 1}", [("progress", {"step": r.lap - 1})])
    if r.lap == 5:
        return turn("too much", [("set_plan", {"steps": ["x"] * 51}),
                                 ("mark_step", {"step": 9})])
    return turn("done")


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    SEEN.clear()
    FLAKY.clear()
    worker = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(
        name="planner", model=ScriptedModel(_script), tools=[*state_tools, progress],
        window_messages=4, compact_after=2))
    yield worker
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def test_the_agent_writes_its_plan_and_facts_lap_by_lap(w: InProcessWorker) -> None:
    run = w.start_run("planner", "go")
    seen: list[tuple[int, list[bool]]] = []
    while w.get_run(run.id).status not in ("succeeded", "failed"):
        w.run_until_idle(max_laps=1)
        state = w.get_state(run.id)
        seen.append((state.lap, [p.done for p in state.plan]))
    assert seen[:4] == [(1, [False, False, False]), (2, [True, False, False]),
                        (3, [True, True, False]), (4, [True, True, True])]
    final = w.get_state(run.id)
    assert final.facts == {"customer": "acme-42", "step_1": "done", "step_2": "done",
                           "step_3": "done"}
    assert final.next_action == "read the file"
    # Over the bound: refused to the model, the state unchanged.
    tool_errors = [m.message.content for m in w.messages(run.id)
                   if m.message.role == "tool" and m.message.is_error]
    assert any("set_plan refused: plan has 51 steps" in t for t in tool_errors)
    assert any("mark_step refused: no plan step 9" in t for t in tool_errors)
    assert [p.title for p in final.plan] == ["read", "write", "check"]
    # Facts and plan survive compaction: always in the system context, even
    # once the messages that pinned them left the window.
    last = SEEN[-1]
    assert all(c.name != "pin_fact" for m in last.messages for c in m.tool_calls)
    assert '"customer": "acme-42"' in last.instructions
    assert "3. [x] check" in last.instructions and "Next planned action: read the file" \
        in last.instructions
    assert any((m.message.meta or {}).get("summary_of") for m in w.messages(run.id))


def test_a_replayed_lap_writes_the_state_once(w: InProcessWorker) -> None:
    run = w.start_run("planner", "go")
    w.run_until_idle(max_laps=1)
    FLAKY[1] = 1  # lap 2's tool writes the state, then its attempt dies
    w.run_until_idle(max_laps=2)
    assert w.get_run(run.id).lap == 2
    assert [e.kind for e in w.events(run.id)].count("retry") == 1
    state = w.get_state(run.id)
    assert [p.done for p in state.plan] == [True, False, False]
    assert w.state_at(run.id, 1).facts == {"customer": "acme-42"}, "lap 1 untouched"


def test_get_state_mid_lap_shows_the_last_commit(w: InProcessWorker) -> None:
    views: list[Any] = []
    agent = w.rt.registry.get("planner")

    def peek(r: ModelRequest) -> ModelResponse:
        if r.lap == 2:
            views.append(w.get_state(r.run_id))
        return _script(r)

    w.rt.registry.register(Agent(name="peeker", model=ScriptedModel(peek),
                                 tools=list(agent.tools)))
    run = w.start_run("peeker", "go")
    w.run_until_idle(max_laps=2)
    (mid,) = views
    assert (mid.lap, mid.status, len(mid.plan)) == (1, "running", 3)
    assert mid.budget["laps"] == 1 and mid.limits.max_laps == agent.budget.max_laps
    assert w.get_state(run.id).lap == 2
    with pytest.raises(UnknownRunError):
        w.get_state("no-such-run")
    store = w.rt.store
    assert isinstance(store, SqlStore)
    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        w.get_state(run.id)
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    assert len([q for q in statements if "SELECT" in q.upper()]) == 1, statements


def test_update_state_racing_a_lap_lands_at_the_next_boundary_once(
        w: InProcessWorker) -> None:
    edits: list[int] = []
    agent = w.rt.registry.get("planner")

    def meddle(r: ModelRequest) -> ModelResponse:
        if r.lap == 2 and not edits:
            # The lap is in flight (claimed, its model step running).
            ops = acting(w, "ops")
            edits.append(ops.update_state(r.run_id, facts={"priority": "high"},
                                          plan=["triage", "fix"], note="customer called").id)
        return _script(r)

    w.rt.registry.register(Agent(name="meddled", model=ScriptedModel(meddle),
                                 tools=list(agent.tools)))
    run = w.start_run("meddled", "go")
    FLAKY[2] = 1  # lap 3's first attempt dies after loading the edit
    w.run_until_idle(max_laps=2)
    assert edits, "requested while lap 2 was in flight"
    lap2 = w.state_at(run.id, 2)
    assert "priority" not in lap2.facts and len(lap2.plan) == 3, "not under the running lap"
    assert w.get_state(run.id).pending_edits == 1
    w.run_until_idle(max_laps=1)
    assert (w.get_run(run.id).lap, w.get_run(run.id).lap_attempts) == (2, 1)
    assert w.get_state(run.id).pending_edits == 1, "kept for the retry, not lost"
    w.run_until_idle()
    lap3 = w.state_at(run.id, 3)
    assert lap3.facts["priority"] == "high" and lap3.facts["customer"] == "acme-42"
    assert [p.title for p in lap3.plan] == ["triage", "fix"]
    notes = [m for m in w.messages(run.id) if "customer called" in m.message.content]
    assert len(notes) == 1 and notes[0].lap == 3 and notes[0].message.role == "user"
    assert "[Note from operator ops]" in notes[0].message.content
    kinds = [(e.kind, e.lap) for e in w.events(run.id)]
    assert kinds.count(("state_updated", 3)) == 1
    assert ("state_update_requested", None) in kinds
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        rows = c.execute(select(state_edits.c.applied_lap).where(
            state_edits.c.run_id == run.id)).all()
    assert [r.applied_lap for r in rows] == [3]
    assert w.get_state(run.id).pending_edits == 0


def test_update_state_refuses_bad_edits_and_finished_runs(w: InProcessWorker) -> None:
    run = w.start_run("planner", "go")
    with pytest.raises(StateLimitError, match="nothing to update"):
        w.update_state(run.id)
    with pytest.raises(StateLimitError, match="51 steps"):
        w.update_state(run.id, plan=["x"] * 51)
    with pytest.raises(StateLimitError, match="fact key"):
        w.update_state(run.id, facts={"bad key\n": 1})
    with pytest.raises(StateLimitError, match="bytes"):
        w.update_state(run.id, facts={"big": "x" * 20_000})
    # Untrusted text is stored cleaned, the same on both dialects.
    w.update_state(run.id, note="call \x00back")
    with pytest.raises(UnknownRunError):
        w.update_state("nope", note="x")
    w.run_until_idle()
    assert w.get_run(run.id).status == "succeeded"
    assert any("call \ufffdback" in m.message.content for m in w.messages(run.id))
    with pytest.raises(InvalidStateError, match="succeeded"):
        w.update_state(run.id, note="too late")


# Its lookup says what is true of this fake (it charges nothing): the failed
# run's ledger settles the call by asking (a failing run never calls again).
@tool(kind="idempotent", lookup=lambda key: None)
def charge(amount: int, ctx: ToolContext) -> str:
    """A journaled tool must not write the run's state (its replay is not a call)."""
    ctx.set_next_action("never")
    return "charged"


def test_a_journaled_tool_cannot_write_state(w: InProcessWorker) -> None:
    w.rt.registry.register(Agent(name="journaled", model=ScriptedModel(
        lambda r: turn("x", [("charge", {"amount": 1})]) if r.lap == 1 else turn("done")),
        tools=[charge]))
    run = w.start_run("journaled", "go")
    w.run_until_idle()
    done = w.get_run(run.id)
    assert done.status == "failed" and "only read tools may write" in (done.error_message or "")
    assert w.get_state(run.id).next_action is None


def test_an_edit_during_the_final_lap_is_dropped_visibly(w: InProcessWorker) -> None:
    """No lap comes after the final one: the edit it raced is marked dropped
    in the transaction that ends the run, with an event, not left pending."""
    def last_call(r: ModelRequest) -> ModelResponse:
        w.update_state(r.run_id, note="one more thing")
        return turn("done")

    w.rt.registry.register(Agent(name="one-lap", model=ScriptedModel(last_call)))
    run = w.start_run("one-lap", "go")
    w.run_until_idle()
    assert w.get_run(run.id).status == "succeeded"
    assert w.get_state(run.id).pending_edits == 0
    dropped = [e for e in w.events(run.id) if e.kind == "state_edits_dropped"]
    assert len(dropped) == 1 and dropped[0].lap == 1
    assert not any("one more thing" in m.message.content for m in w.messages(run.id))
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        rows = c.execute(select(state_edits.c.applied_lap, state_edits.c.dropped_lap).where(
            state_edits.c.run_id == run.id)).all()
    assert [tuple(r) for r in rows] == [(None, 1)]
