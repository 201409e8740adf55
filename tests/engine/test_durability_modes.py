"""Which lap commits skip the WAL flush on Postgres (``LapCommit.durable``):
a lap that only read and hands the run on commits on the store's relaxed
engine (``synchronous_commit=off``, ``store.sqlbase``); a lap with a side
effect, the lap that ends the run and a lap that pauses never do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, event, text

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.store import lapcommit
from agent_worker.store.sql import SqlStore
from agent_worker.tools import Tool, ToolContext
from tests.principals import acting

#: What the model asks for, lap by lap; then it answers and the run ends.
PLAN: list[list[tuple[str, dict[str, Any]]]] = [
    [("look", {"query": "a"})],
    [("pay", {"amount": 2})],
    [("look", {"query": "c"}), ("pay", {"amount": 4})],
    [("look", {"query": "d"}), ("look", {"query": "e"})],
    [("ask", {"query": "f"})],
]


def _tools() -> list[Tool]:
    @tool(kind="idempotent")
    def pay(amount: int, ctx: ToolContext) -> dict[str, Any]:
        """A payment: a side effect."""
        return {"paid": amount}

    @tool
    def look(query: str) -> str:
        """A read."""
        return f"found {query}"

    @tool(approval=True)
    def ask(query: str) -> str:
        """A read a human approves first: the lap pauses."""
        return f"asked {query}"

    return [pay, look, ask]


def _model() -> ScriptedModel:
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > len(PLAN):
            return turn("done")
        return turn(f"lap {r.lap}", PLAN[r.lap - 1])

    return ScriptedModel(script)


@pytest.fixture
def worker(database_url: str, agent_registry: Registry) -> Iterator[InProcessWorker]:
    w = InProcessWorker(database_url, retry_backoff_seconds=0)
    w.rt.registry = agent_registry
    agent_registry.register(Agent(name="modes", model=_model(), tools=_tools()))
    yield w
    w.close()


def _committed_on(store: SqlStore) -> list[str]:
    """For each lap commit from now on, ``relaxed`` or ``durable``: which of
    the store's engines sent it."""
    commit = str(lapcommit.ONE_STATEMENT.compile(dialect=store.engine.dialect))
    seen: list[str] = []

    def on(name: str) -> Any:
        def sent(conn: Connection, cursor: Any, statement: str, *_: Any) -> None:
            if statement == commit:
                seen.append(name)
        return sent

    event.listen(store.engine, "before_cursor_execute", on("durable"))
    event.listen(store._relaxed_engine(), "before_cursor_execute", on("relaxed"))
    return seen


def test_only_laps_that_read_and_go_on_skip_the_flush(worker: InProcessWorker) -> None:
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    with store._relaxed_engine().connect() as c:
        assert c.execute(text("SHOW synchronous_commit")).scalar() == "off"
    seen = _committed_on(store)
    run = worker.start_run("modes", "go")
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "waiting"  # lap 5 asks for approval
    assert seen == ["relaxed", "durable", "durable", "relaxed", "durable"]
    acting(worker, "ops@example.com").approve(run.id)
    assert worker.wait(run.id, timeout=30).status == "succeeded"
    # Lap 5 again, its approved read made: a read; lap 6 ends the run.
    assert seen[5:] == ["relaxed", "durable"]
