"""The agent of the parallel-calls acceptance test, kept out
of ``tests/agents.py`` so the test's workers import it explicitly
(``AGENT_WORKER_AGENT_MODULES``): one turn of ``refunds`` idempotent refunds
through the demo vendor, all asked at once, then the answer."""

from __future__ import annotations

import json
import os
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.demo.vendor import VendorClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool
from tests.agents import params


@tool(kind="idempotent")
def refund_many(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund through the vendor, passing the idempotency key."""
    with VendorClient(os.environ["AGENT_WORKER_VENDOR_URL"]) as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


def _turn(r: ModelRequest) -> ModelResponse:
    n = int(params(r).get("refunds", 5))
    if r.lap > 1:
        return turn(json.dumps({"refunds": n}))
    return turn("all at once", [("refund_many", {"order_id": f"o{i}", "amount_cents": 100 + i})
                                for i in range(n)])


register(Agent(name="parallel-refunds", model=lambda: ScriptedModel(_turn),
               tools=[refund_many], window_messages=100))
