"""Compaction keeps the model's window bounded on long runs, is recorded as a
message, and a resumed run sees the same window as the one that crashed.
Both dialects (``bare_worker``): the agent lives in the worker's own registry."""

from __future__ import annotations

import pytest

from agent_worker import Agent, Budget, InProcessWorker, ScriptedModel, tool, turn
from agent_worker.core.messages import ModelRequest, ModelResponse

seen: dict[int, ModelRequest] = {}


@tool
def look(n: int) -> str:
    """Look at item n."""
    return f"item {n} is fine"


def _script(r: ModelRequest) -> ModelResponse:
    seen[r.lap] = r
    return turn("done") if r.lap >= 120 else turn("", [("look", {"n": r.lap})])


@pytest.fixture
def worker(bare_worker: InProcessWorker) -> InProcessWorker:
    bare_worker.rt.registry.register(Agent(
        name="compacting", model=ScriptedModel(_script), tools=[look], window_messages=20,
        compact_after=30, budget=Budget(max_laps=None)))
    return bare_worker


def test_window_is_bounded_and_summary_recorded(worker: InProcessWorker) -> None:
    seen.clear()
    run = worker.start_run("compacting", "inspect everything")
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    late = seen[119]
    assert len(late.messages) <= 20 + 1  # recent messages plus one summary
    summary = late.messages[0]
    assert summary.content.startswith("[Summary of the conversation before message")
    assert "called look" in summary.content and "user: inspect everything" in summary.content
    stored = [m for m in worker.messages(run.id) if (m.message.meta or {}).get("summary_of")]
    assert stored and all(m.message.role == "user" for m in stored)
    state = worker.state_at(run.id, 119)
    assert state.summary_seq == max(m.seq for m in stored if m.lap <= 119)
    # The window at lap 119 is as long as at lap 60: bounded, not growing.
    assert abs(len(seen[60].messages) - len(late.messages)) <= 2


def test_replayed_lap_sees_the_same_window(worker: InProcessWorker) -> None:
    """Rebuilt from the records: a second build for the same lap is identical."""
    from agent_worker.core.checkpoint import load_checkpoint
    from agent_worker.engine.window import build_request

    seen.clear()
    run = worker.start_run("compacting", "inspect everything")
    worker.run_until_idle()
    store = worker.rt.store
    agent = worker.rt.registry.get("compacting")
    ckpt = load_checkpoint(store.get_checkpoint(run.id, 99) or {})
    start = ckpt.message_count - agent.window_messages
    window = [m for m in store.list_messages(run.id, end=ckpt.message_count)
              if m.seq >= start or m.seq == ckpt.summary_seq]
    rebuilt = build_request(agent, run.id, 100, ckpt, window, "k")
    assert rebuilt.messages == seen[100].messages
