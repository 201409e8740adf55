"""The demo agent, ``refund-desk``: over about 20 laps it lists orders, reads
each one, refunds it through the vendor's payments API and emails a notice.
Driven by a ScriptedModel, so it runs anywhere with no API key; refunds and
notices are real HTTP calls to the vendor service (``agent_worker.demo.vendor``)
at ``AGENT_WORKER_VENDOR_URL``, each carrying its idempotency key.

The script decides from the tool results it has seen, not from the lap number,
like a real model: a refund the vendor refused is reported as failed (and its
customer gets no "refunded" notice), and when no refund landed at all the run
fails with ``task_failed`` instead of answering with a total.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_worker.agent import Agent, register
from agent_worker.core.budget import Budget
from agent_worker.core.errors import TaskFailedError, ToolError
from agent_worker.core.messages import Message, ModelRequest, ModelResponse
from agent_worker.core.settings import get_settings
from agent_worker.demo.vendor import VendorClient
from agent_worker.model.protocol import ModelClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


class DemoInput(BaseModel):
    """The run's input; an unknown field (``{"count": "many"}``) is refused at
    submit rather than silently replaced by the defaults."""

    model_config = ConfigDict(extra="forbid")

    orders: int = Field(6, ge=1, le=16, description="How many orders to refund.")
    reason: str = Field("late delivery", max_length=200,
                        description="Why, quoted in the customer's notice.")


def _vendor() -> VendorClient:
    url = get_settings().vendor_url
    if not url:
        raise ToolError("no vendor configured: set AGENT_WORKER_VENDOR_URL "
                        "(deploy/local/services.sh start runs one on port 63800)")
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


def _outcomes(messages: tuple[Message, ...]) -> dict[tuple[str, str], Message]:
    """What each call seen so far returned, keyed by (tool, order id or "to").

    A result answers the call with its id in the latest assistant turn (call
    ids repeat across turns, so never look further back)."""
    seen: dict[tuple[str, str], Message] = {}
    asked: dict[str, tuple[str, str]] = {}
    for m in messages:
        if m.role == "assistant":
            asked = {c.id: (c.name, str(c.arguments.get("order_id") or c.arguments.get("to")
                                        or "")) for c in m.tool_calls}
        elif m.role == "tool" and m.tool_call_id in asked:
            seen[asked[m.tool_call_id]] = m
    return seen


def _final(orders: list[str], seen: dict[tuple[str, str], Message]) -> ModelResponse:
    refunded = [o for o in orders if not seen[("refund", o)].is_error]
    failed = [{"order_id": o, "error": seen[("refund", o)].content}
              for o in orders if seen[("refund", o)].is_error]
    if not refunded:
        raise TaskFailedError(f"no refund landed: all {len(orders)} failed; first: "
                              f"{failed[0]['order_id']}: {failed[0]['error']}")
    unsent = [o for o in refunded if seen[("send_notice", f"{o}@customers.example")].is_error]
    return turn(json.dumps({"refunded": len(refunded),
                            "total_cents": sum(order_amount(o) for o in refunded),
                            "failed": failed, "notices_failed": unsent}))


def _script(request: ModelRequest) -> ModelResponse:
    first = next(m for m in request.messages if m.role == "user")
    params = DemoInput.model_validate(json.loads(first.content or "{}"))
    orders = [f"ord-{i + 1:03d}" for i in range(params.orders)]
    seen = _outcomes(request.messages)
    if ("list_orders", "") not in seen:
        return turn("Listing orders.", [("list_orders", {"count": params.orders})])
    for order in orders:
        to = f"{order}@customers.example"
        if ("get_order", order) not in seen:
            return turn(f"Reading {order}.", [("get_order", {"order_id": order})])
        refund_result = seen.get(("refund", order))
        if refund_result is None:
            return turn(f"Refunding {order}.", [("refund", {
                "order_id": order, "amount_cents": order_amount(order)})])
        if not refund_result.is_error and ("send_notice", to) not in seen:
            return turn(f"Notifying {order}.", [("send_notice", {
                "to": to, "body": f"Your order {order} was refunded ({params.reason})."})])
    return _final(orders, seen)


def demo_model() -> ModelClient:
    """A real provider when ``AGENT_WORKER_DEMO_MODEL`` names one and its key is
    set (``openai:gpt-4o-mini``, ``anthropic:claude-haiku-4-5``; an OpenAI-compatible
    server via ``OPENAI_BASE_URL``), else the scripted model."""
    provider, _, model = os.environ.get("AGENT_WORKER_DEMO_MODEL", "").partition(":")
    # The provider SDKs are an optional extra (``[providers]``): import one only
    # when the demo is asked to use it.
    if provider == "openai" and os.environ.get("OPENAI_API_KEY"):
        from agent_worker.model.openai_client import OpenAIChatModel

        return OpenAIChatModel(model or "gpt-4o-mini",
                               base_url=os.environ.get("OPENAI_BASE_URL"))
    if provider == "anthropic" and os.environ.get("ANTHROPIC_API_KEY"):
        # the same optional extra: imported only when asked for
        from agent_worker.model.anthropic_client import AnthropicModel

        return AnthropicModel(model or "claude-haiku-4-5")
    return ScriptedModel(_script)


refund_desk = register(Agent(
    name="refund-desk",
    model=demo_model,
    tools=[list_orders, get_order, refund, send_notice],
    instructions="You are a refund desk. The user message says how many orders to handle. "
                 "List them, read each order, refund its amount once, then email the "
                 "customer a notice. A refund that fails is not retried and gets no "
                 "notice. When every order is done, answer with JSON "
                 '{"refunded": N, "total_cents": T, "failed": [{"order_id": ID, '
                 '"error": E}], "notices_failed": [ID]} counting only refunds that landed.',
    input_model=DemoInput,
    window_messages=120,
    budget=Budget(max_laps=60),
))
