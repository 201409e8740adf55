"""A run whose laps start from what this process committed (``store.lapcache``)
shows the model exactly what a run reading every lap back from the database
does: same windows, same compaction summaries, same checkpoints."""

from __future__ import annotations

from typing import Any

import pytest

from agent_worker import Agent, Budget, ScriptedModel, tool, turn
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.inprocess import InProcessWorker
from agent_worker.store.sql import SqlStore


@tool
def look(n: int) -> str:
    """Look at item n."""
    return f"item {n} is fine"


def _run(w: InProcessWorker, cache: bool) -> tuple[list[Any], list[Any]]:
    seen: list[Any] = []

    def script(r: ModelRequest) -> ModelResponse:
        seen.append((r.lap, [(m.role, m.content) for m in r.messages]))
        return turn("done") if r.lap >= 24 else turn("", [("look", {"n": r.lap})])

    w.rt.registry.register(Agent(name="cached", model=ScriptedModel(script), tools=[look],
                                 window_messages=6, compact_after=8,
                                 budget=Budget(max_laps=None)))
    store = w.rt.store
    assert isinstance(store, SqlStore)
    store.lap_cache.max_runs = 256 if cache else 0
    run = w.start_run("cached", "inspect everything")
    w.run_until_idle()
    assert w.get_run(run.id).status == "succeeded"
    states = [store.get_checkpoint(run.id, lap) for lap in range(1, 25)]
    for state in states:
        assert state is not None
        state.pop("budget", None)  # spend carries timestamps of its own
    return seen, states


def test_cached_laps_see_what_database_reads_would(bare_worker: InProcessWorker,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = bare_worker.rt.store
    assert isinstance(store, SqlStore)
    hits: list[int] = []
    offer = store.lap_cache.offer

    def counted(run_id: str, lap: int, window: int) -> Any:
        found = offer(run_id, lap, window)
        hits.append(found is not None)
        return found

    monkeypatch.setattr(store.lap_cache, "offer", counted)
    with_cache = _run(bare_worker, cache=True)
    assert sum(hits) >= 20, "the laps did not start from the cache"
    hits.clear()
    without = _run(bare_worker, cache=False)
    assert sum(hits) == 0
    assert with_cache == without
