"""Time travel and retention on Postgres: fork from any lap without touching
the original or repeating its effects; prune checkpoints of finished runs while
keeping the final state and the full effect ledger."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_worker import Agent, Budget, InProcessWorker, ScriptedModel, register, tool, turn
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext

_vendor_url: dict[str, str] = {}


@tool(kind="idempotent")
def charge(order: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund ``order`` at the vendor."""
    from agent_worker.demo.vendor import VendorClient

    with VendorClient(_vendor_url["url"]) as v:
        return v.refund(order, 100, idempotency_key=ctx.idempotency_key)


@tool(kind="idempotent")
def record(order: str, ctx: ToolContext) -> str:
    """A journaled effect with no network, for long retention runs."""
    return ctx.idempotency_key


def _script(r: ModelRequest) -> ModelResponse:
    last = int(next(m for m in r.messages if m.role == "user").content)
    if r.lap > last:
        return turn("done")
    return turn("", [("charge" if last < 100 else "record", {"order": f"o{r.lap}"})])


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[VendorProcess]:
    with start_vendor(tmp_path / "v.db") as v:
        _vendor_url["url"] = v.url
        yield v


@pytest.fixture
def worker(database_url: str) -> Iterator[InProcessWorker]:
    register(Agent(name="history", model=ScriptedModel(_script), tools=[charge, record],
                   window_messages=2000, budget=Budget(max_laps=None)))
    register(Agent(name="history-shallow", model=ScriptedModel(_script), tools=[charge, record],
                   window_messages=2000, budget=Budget(max_laps=None), retention="shallow"))
    w = InProcessWorker(database_url)
    yield w
    assert isinstance(w.rt.store, SqlStore)
    w.rt.store.dispose()


def test_fork_from_lap_10_completes_without_repeating_effects(
        worker: InProcessWorker, vendor: VendorProcess) -> None:
    original = worker.start_run("history", "15")
    worker.run_until_idle()
    done = worker.get_run(original.id)
    assert done.status == "succeeded" and done.lap == 16
    before = vendor.client.stats()
    original_keys = {e.key for e in worker.effects(original.id)}

    fork = worker.fork(original.id, 10, facts={"note": "forked"})
    assert fork.parent_run_id == original.id and fork.forked_from_lap == 10
    assert worker.state_at(fork.id, 10).facts == {"note": "forked"}
    worker.run_until_idle()
    forked = worker.get_run(fork.id)
    assert forked.status == "succeeded" and forked.lap == 16
    after = vendor.client.stats()
    assert all(after["by_key"][k] == 1 for k in original_keys)
    fork_keys = {e.key for e in worker.effects(fork.id)}
    assert fork_keys.isdisjoint(original_keys) and len(fork_keys) == 5  # laps 11..15
    assert after["applied"] == before["applied"] + 5 and after["duplicates"] == 0
    # The original is untouched.
    assert worker.get_run(original.id) == done
    assert [c[0] for c in worker.checkpoints(fork.id)] == list(range(10, 17))


@pytest.mark.parametrize(("agent", "kept"), [("history-shallow", 1), ("history", 1)])
def test_retention_keeps_final_checkpoint_and_full_ledger(
        worker: InProcessWorker, agent: str, kept: int) -> None:
    run = worker.start_run(agent, "499")
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.lap == 500
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    now = worker.rt.clock.now()
    # Young finished runs: shallow ones are pruned at once, full ones kept...
    store.prune(checkpoints_before=now - timedelta(days=7), ledger_before=now - timedelta(
        days=365), batch=100)
    young = len(worker.checkpoints(run.id))
    assert young == (1 if agent == "history-shallow" else 501)
    # ...until they pass the retention age.
    store.prune(checkpoints_before=now + timedelta(days=1), ledger_before=now - timedelta(
        days=365), batch=100)
    assert [c[0] for c in worker.checkpoints(run.id)] == [500][:kept]
    assert worker.state_at(run.id, 500).lap == 500
    assert len(worker.effects(run.id)) == 499
    assert len(worker.messages(run.id)) == 1 + 2 * 499 + 1
