"""Parallel tool calls through real Celery workers, Postgres, Redis and the demo
vendor: five idempotent refunds asked in one turn run
at once; the worker is SIGKILLed once the first has landed in the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tests.agents_parallel  # noqa: F401  (registers the agent in this process)
from agent_worker.api import AgentWorker
from agent_worker.core.constants import effect_key
from agent_worker.demo.vendor import start_vendor
from tests.integration.test_effects import fired, moved
from tests.support import TEST_AGENTS, Fleet

pytestmark = pytest.mark.integration


def test_five_parallel_refunds_with_a_kill_mid_way_land_once_in_the_models_order(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    with start_vendor(tmp_path / "vendor.db", "idempotent") as vendor:
        # The first request answers after 1.5 s, the other four after 3.5 s:
        # the first outcome lands while the others are still in flight, and the
        # armed fault kills the worker right after it.
        vendor.client.inject("hang", count=1, path="/refunds", seconds=1.5)
        vendor.client.inject("hang", count=4, path="/refunds", seconds=3.5)
        fleet.worker(concurrency=1, AGENT_WORKER_VENDOR_URL=vendor.url,
                     AGENT_WORKER_AGENT_MODULES=f"{TEST_AGENTS},tests.agents_parallel",
                     AGENT_WORKER_FAULTS="after_outcome@refund_many")
        fleet.beat()
        run = aw.start_run("parallel-refunds", {"refunds": 5})
        done = aw.wait(run.id, timeout=120)
        assert done.status == "succeeded", done.error_detail
        assert fired(fleet, "after_outcome@refund_many") == 1, "the kill never happened"
        # Not ``done.recoveries``: the redelivered lap may take the dead
        # worker's expired lease itself before the sweeper counts a recovery.
        # The replay is shown below: each call that had not landed was sent twice.

        keys = [effect_key(run.id, 1, i) for i in range(5)]
        # Every effect applied exactly once at the vendor.
        assert moved(vendor, run.id) == dict.fromkeys(keys, 1)
        # Only what had not landed in the ledger was called again.
        effects = {e.key: e for e in aw.effects(run.id)}
        assert all(effects[k].status == "applied" for k in keys)
        requests = [c for c in vendor.client.calls() if c["path"] == "/refunds"]
        sent = {k: sum(1 for c in requests if c["key"] == k) for k in keys}
        landed = [k for k in keys if effects[k].attempts == 1]
        assert 1 <= len(landed) < 5, effects  # the kill came mid-turn
        assert sent == {k: 1 if k in landed else 2 for k in keys}
        # The first attempts overlapped: each started before any of them ended.
        first = [next(c for c in requests if c["key"] == k) for k in keys]
        assert max(c["started"] for c in first) < min(c["ended"] for c in first)
        # The model reads the results in the order it asked.
        messages = [m.message for m in aw.messages(run.id)]
        asked = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
        results = [m for m in messages if m.role == "tool"]
        assert [m.tool_call_id for m in results] == asked
        assert [json.loads(m.content)["order_id"] for m in results] == [
            f"o{i}" for i in range(5)]
        assert [json.loads(m.content)["id"] for m in results] == [
            effects[k].result["id"] for k in keys]
