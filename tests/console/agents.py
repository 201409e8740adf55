"""Agents the console tests run: one that asks a human before an irreversible
refund and returns a tool result holding markup, one whose model fails on lap 2,
one whose card charge loses its answer (the effect is left unknown for a human)."""

from __future__ import annotations

from typing import Any

from agent_worker.agent import Agent, Registry
from agent_worker.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool

#: What the refund tool returns: a script a page must show as text.
HOSTILE = "<script>document.title='pwned'</script>"


@tool(kind="irreversible")
def refund(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order to the customer's card; money leaves the company."""
    return {"refunded": amount_cents, "note": HOSTILE}


@tool
def look(order_id: str) -> str:
    """Read an order."""
    return f"order {order_id}: double charged {HOSTILE}"


#: Charge keys whose first call already lost its answer: the next call lands.
_LOST: set[str] = set()


@tool(kind="compensatable")
def charge(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Charge the customer's card. Neither idempotent nor looked up: a lost
    answer leaves the charge unknown until a human says whether it landed."""
    if ctx.idempotency_key not in _LOST:
        _LOST.add(ctx.idempotency_key)
        raise ConnectionResetError("connection reset after the card network took it")
    return {"charged": amount_cents, "order": order_id}


def _charges(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("Charging order 9.", [("charge", {"order_id": "9", "amount_cents": 700})])
    return turn("charged")


def _refunds(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("The customer was charged twice for order 7; I will refund one charge.",
                    [("look", {"order_id": "7"})])
    if r.lap == 2:
        return turn("Refunding the duplicate charge of order 7.",
                    [("refund", {"order_id": "7", "amount_cents": 1500})])
    return turn("done")


def _fails(r: ModelRequest) -> ModelResponse:
    if r.lap >= 2:
        raise RuntimeError("provider exploded on lap 2")
    return turn("first lap fine", [("look", {"order_id": "1"})])


def _flaky() -> ScriptedModel:
    """Fails the first attempt of lap 1, like a provider's hiccup; then finishes."""
    calls = {"n": 0}

    def script(r: ModelRequest) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("provider hiccup")
        return turn("recovered")

    return ScriptedModel(script)


def registry() -> Registry:
    """A registry holding only the console's test agents."""
    reg = Registry()
    reg.register(Agent(name="refunds", model=lambda: ScriptedModel(_refunds),
                       tools=[look, refund], approval_owner="approver"))
    reg.register(Agent(name="fails", model=lambda: ScriptedModel(_fails), tools=[look]))
    reg.register(Agent(name="charges", model=lambda: ScriptedModel(_charges), tools=[charge]))
    flaky = _flaky()
    reg.register(Agent(name="flaky", model=lambda: flaky))
    return reg
