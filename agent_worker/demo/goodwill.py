"""The demo's approval case, ``goodwill-credit``: the agent reads an order and
proposes a goodwill credit, an irreversible payment that waits for a human in
the console's approvals inbox (owner: the ``support-leads`` group) before it
reaches the vendor. The demo leaves one such run waiting, so the newcomer's
inbox is not empty, and ``bench.screenshots`` photographs it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_worker.agent import Agent, register
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.demo.refund_desk import _vendor, get_order, order_amount
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool

#: Who decides a goodwill credit (a group an approver is a member of).
OWNER = "support-leads"


class GoodwillInput(BaseModel):
    """Which order, and how many times it went wrong."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field("ord-042", max_length=40, description="The order to make good.")
    incidents: int = Field(2, ge=1, le=10, description="How often it went wrong.")


@tool(kind="irreversible")
def credit(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Pay a goodwill credit to the customer of an order; money that leaves for
    good, so a person approves every one."""
    with _vendor() as vendor:
        return vendor.refund(f"goodwill-{order_id}", amount_cents,
                             idempotency_key=ctx.idempotency_key)


def _script(request: ModelRequest) -> ModelResponse:
    first = next(m for m in request.messages if m.role == "user")
    given = GoodwillInput.model_validate_json(first.content or "{}")
    if request.lap == 1:
        return turn(f"Order {given.order_id} went wrong {given.incidents} times; reading it.",
                    [("get_order", {"order_id": given.order_id})])
    if request.lap == 2:
        amount = order_amount(given.order_id) // 5
        return turn(f"The customer of {given.order_id} had {given.incidents} incidents; a "
                    f"credit of a fifth of the order ({amount} cents) keeps them, and is "
                    "within the desk's policy.",
                    [("credit", {"order_id": given.order_id, "amount_cents": amount})])
    return turn(json.dumps({"credited": given.order_id}))


goodwill_credit = register(Agent(
    name="goodwill-credit",
    model=lambda: ScriptedModel(_script),
    tools=[get_order, credit],
    input_model=GoodwillInput,
    approval_owner=OWNER,
))

__all__ = ["OWNER", "GoodwillInput", "credit", "goodwill_credit"]
