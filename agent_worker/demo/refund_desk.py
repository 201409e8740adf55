"""The demo agent, ``refund-desk``: over about 20 laps it lists orders, reads
each one, refunds it through the vendor's payments API and emails a notice.
Driven by a ScriptedModel, so it runs anywhere with no API key; refunds and
notices are real HTTP calls to the vendor service (``agent_worker.demo.vendor``)
at ``AGENT_WORKER_VENDOR_URL``, each carrying its idempotency key.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from pydantic import BaseModel, Field

from agent_worker.agent import Agent, register
from agent_worker.budget import Budget
from agent_worker.demo.vendor import VendorClient
from agent_worker.errors import ToolError
from agent_worker.messages import ModelRequest, ModelResponse
from agent_worker.model.protocol import ModelClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


class DemoInput(BaseModel):
    orders: int = Field(6, ge=1, le=16, description="How many orders to refund.")
    reason: str = "late delivery"


def _vendor() -> VendorClient:
    url = os.environ.get("AGENT_WORKER_VENDOR_URL")
    if not url:
        raise ToolError("no vendor configured: set AGENT_WORKER_VENDOR_URL")
    return VendorClient(url)


def order_amount(order_id: str) -> int:
    """A stable amount per order, so every process agrees."""
    return 500 + zlib.crc32(order_id.encode()) % 9500


@tool
def list_orders(count: int) -> list[str]:
    """List the ids of the orders waiting for a refund."""
    return [f"ord-{i + 1:03d}" for i in range(count)]


@tool
def get_order(order_id: str) -> dict[str, Any]:
    """Read one order: amount and customer."""
    return {"order_id": order_id, "amount_cents": order_amount(order_id),
            "customer": f"{order_id}@customers.example"}


@tool(kind="idempotent")
def refund(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order through the payments API (exactly once per call)."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@refund.lookup
def _refund_lookup(key: str) -> dict[str, Any] | None:
    with _vendor() as v:
        found = v.lookup(key)
    return None if found is None else dict(found.get("response") or found)


@tool(kind="idempotent")
def send_notice(to: str, body: str, ctx: ToolContext) -> dict[str, Any]:
    """Email the customer."""
    with _vendor() as v:
        return v.notice(to, body, idempotency_key=ctx.idempotency_key)


def _script(request: ModelRequest) -> ModelResponse:
    first = next(m for m in request.messages if m.role == "user")
    params = DemoInput.model_validate(json.loads(first.content or "{}"))
    n, lap = params.orders, request.lap
    if lap == 1:
        return turn("Listing orders.", [("list_orders", {"count": n})])
    k, phase = divmod(lap - 2, 3)
    if k >= n:
        return turn(json.dumps({"refunded": n, "total_cents": sum(
            order_amount(f"ord-{i + 1:03d}") for i in range(n))}))
    order = f"ord-{k + 1:03d}"
    if phase == 0:
        return turn(f"Reading {order}.", [("get_order", {"order_id": order})])
    if phase == 1:
        return turn(f"Refunding {order}.", [("refund", {
            "order_id": order, "amount_cents": order_amount(order)})])
    return turn(f"Notifying {order}.", [("send_notice", {
        "to": f"{order}@customers.example",
        "body": f"Your order {order} was refunded ({params.reason})."})])


def demo_model() -> ModelClient:
    """A real provider when ``AGENT_WORKER_DEMO_MODEL`` names one and its key is
    set (``openai:gpt-4o-mini``, ``anthropic:claude-haiku-4-5``; an OpenAI-compatible
    server via ``OPENAI_BASE_URL``), else the scripted model."""
    provider, _, model = os.environ.get("AGENT_WORKER_DEMO_MODEL", "").partition(":")
    if provider == "openai" and os.environ.get("OPENAI_API_KEY"):
        from agent_worker.model.openai_client import OpenAIChatModel

        return OpenAIChatModel(model or "gpt-4o-mini",
                               base_url=os.environ.get("OPENAI_BASE_URL"))
    if provider == "anthropic" and os.environ.get("ANTHROPIC_API_KEY"):
        from agent_worker.model.anthropic_client import AnthropicModel

        return AnthropicModel(model or "claude-haiku-4-5")
    return ScriptedModel(_script)


refund_desk = register(Agent(
    name="refund-desk",
    model=demo_model,
    tools=[list_orders, get_order, refund, send_notice],
    instructions="You are a refund desk. The user message says how many orders to handle. "
                 "List them, read each order, refund its amount once, then email the "
                 "customer a notice. When every order is done, answer with JSON "
                 '{"refunded": N, "total_cents": T}.',
    input_model=DemoInput,
    window_messages=120,
    budget=Budget(max_laps=60),
))
