"""A lap gives its place (``engine.active_laps``) up while it waits on its
model and on its tools, on SQLite and Postgres: with one place, two laps can
only both be inside their model calls (or tool calls) at once if the first
gave its place to the second. Proved with a barrier, which breaks (failing
the call, so the lap) if the laps got there one after the other."""

from __future__ import annotations

import threading
from typing import Any

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.active_laps import ActiveLaps
from agent_worker.engine.lap import run_lap


def _first_laps_together(w: InProcessWorker, agent: str) -> list[str]:
    """Start two runs and run their first laps in two threads at once."""
    runs = [w.start_run(agent, "go").id for _ in range(2)]
    w.queue.pending.clear()
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda r=r: outcomes.append(run_lap(w.rt, r, 1)))
               for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_two_laps_wait_on_their_models_at_once_with_one_place(
        bare_worker: InProcessWorker) -> None:
    w = bare_worker
    w.rt.active_laps = ActiveLaps(1)
    both_asking = threading.Barrier(2, timeout=20)

    def script(_: ModelRequest) -> ModelResponse:
        both_asking.wait()
        return turn("done")

    w.rt.registry.register(Agent(name="waits", model=ScriptedModel(script)))
    assert _first_laps_together(w, "waits") == ["finished", "finished"]
    assert not both_asking.broken


def test_two_laps_wait_on_their_tools_at_once_with_one_place(
        bare_worker: InProcessWorker) -> None:
    w = bare_worker
    w.rt.active_laps = ActiveLaps(1)
    both_calling = threading.Barrier(2, timeout=20)

    @tool(kind="read")
    def look(n: int) -> dict[str, Any]:
        both_calling.wait()
        return {"n": n}

    def script(r: ModelRequest) -> ModelResponse:
        return turn("looking", [("look", {"n": 1})]) if r.lap == 1 else turn("done")

    w.rt.registry.register(Agent(name="calls", model=ScriptedModel(script), tools=[look]))
    assert _first_laps_together(w, "calls") == ["committed", "committed"]
    assert not both_calling.broken
