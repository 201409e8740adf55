"""Row versions a lap leaves on Postgres: every UPDATE writes a new version
of a row and leaves the old one dead until vacuum, which a long transaction
anywhere on the server holds off (BENCHMARKS.md, the database-side faults).
A lap writes its run row twice, at its claim and at its commit, with or
without a side effect (the effect's intent locks the row, ``store.rows.fence``,
without writing it); an effect's row is written twice, its intent and its
outcome.

Counted by a row trigger of the test's own database (a statement that
matches no row or only locks one fires none), laps run one by one with no
sweep in between, on a lease long enough that no heartbeat renews it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.lap import run_lap
from agent_worker.tools import Tool, ToolContext

LAPS = 3

_COUNTER = """
CREATE TABLE written_versions (tbl text NOT NULL, op text NOT NULL);
CREATE FUNCTION count_written_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO written_versions VALUES (TG_TABLE_NAME, TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER count_runs AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION count_written_version();
CREATE TRIGGER count_effects AFTER INSERT OR UPDATE ON effects
    FOR EACH ROW EXECUTE FUNCTION count_written_version();
"""


@pytest.fixture
def counted(own_database_url: str) -> Iterator[str]:
    """The test's own database, counting the versions written to ``runs`` and
    ``effects``."""
    engine = create_engine(own_database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.exec_driver_sql(_COUNTER)
    engine.dispose()
    yield own_database_url


def _written(url: str) -> dict[tuple[str, str], int]:
    engine = create_engine(url)
    try:
        with engine.begin() as c:
            rows = c.execute(text("DELETE FROM written_versions RETURNING tbl, op")).all()
    finally:
        engine.dispose()
    found: dict[tuple[str, str], int] = {}
    for tbl, op in rows:
        found[(tbl, op)] = found.get((tbl, op), 0) + 1
    return found


def _tools() -> list[Tool]:
    @tool(kind="idempotent")
    def pay(amount: int, ctx: ToolContext) -> dict[str, Any]:
        """A payment: an effect, written to the ledger before and after."""
        return {"paid": amount, "key": ctx.idempotency_key}

    @tool
    def look(query: str) -> str:
        """A read: no ledger row."""
        return f"found {query}"

    return [pay, look]


def _model(call: str) -> ScriptedModel:
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > LAPS:
            return turn("done")
        args = {"amount": r.lap} if call == "pay" else {"query": str(r.lap)}
        return turn(f"lap {r.lap}", [(call, args)])

    return ScriptedModel(script)


@pytest.mark.parametrize("call", ["look", "pay"])
def test_a_lap_writes_its_run_row_twice_and_an_effect_its_row_twice(
        counted: str, agent_registry: Registry, call: str) -> None:
    w = InProcessWorker(counted, retry_backoff_seconds=0, lease_ttl_seconds=3600,
                        heartbeat_interval_seconds=1800)
    w.rt.registry = agent_registry
    agent_registry.register(Agent(name="versions", model=_model(call), tools=_tools()))
    try:
        run = w.start_run("versions", "go")
        _written(counted)  # the run's insert and its hand-off
        for lap in range(1, LAPS + 1):
            [due] = w.queue.pending
            w.queue.pending.clear()
            assert (due.run_id, due.lap) == (run.id, lap)
            assert run_lap(w.rt, due.run_id, due.lap) == "committed"
            effects = 1 if call == "pay" else 0
            assert _written(counted) == {
                ("runs", "UPDATE"): 2,  # the claim and the commit, nothing else
                **({("effects", "INSERT"): 1, ("effects", "UPDATE"): 1} if effects else {}),
            }, f"lap {lap}"
    finally:
        w.close()
