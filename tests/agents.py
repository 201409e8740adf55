"""Agents the tests run, registered in every worker process through
``AGENT_WORKER_AGENT_MODULES``. Each reads its parameters from the run input
(the first user message), so any process scripts the same answers."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.budget import Budget
from agent_worker.control import sleep_tool, wait_for_signal_tool
from agent_worker.demo.vendor import VendorClient
from agent_worker.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


def params(request: ModelRequest) -> dict[str, Any]:
    first = next(m for m in request.messages if m.role == "user")
    value: dict[str, Any] = json.loads(first.content or "{}")
    return value


@tool
def step(n: int, pause: float = 0.0) -> dict[str, int]:
    """A read step; ``pause`` makes the lap slow enough to kill mid-way."""
    if pause:
        time.sleep(pause)
    return {"step": n}


def _loop(r: ModelRequest) -> ModelResponse:
    p = params(r)
    if r.lap >= int(p.get("laps", 30)):
        return turn(json.dumps({"laps": r.lap}))
    return turn(f"lap {r.lap}", [("step", {"n": r.lap, "pause": float(p.get("pause", 0))})])


register(Agent(name="loop", model=lambda: ScriptedModel(_loop), tools=[step],
               window_messages=2000, budget=Budget(max_laps=1000)))


def _vendor() -> VendorClient:
    return VendorClient(os.environ["AGENT_WORKER_VENDOR_URL"])


@tool(kind="idempotent")
def pay(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund through the vendor, passing the idempotency key."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@tool(kind="compensatable")
def book(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A saga step: a payment that can be undone."""
    if amount_cents < 0:
        from agent_worker.errors import ToolError

        raise ToolError("negative amount")
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@book.compensator
def _unbook(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
    with _vendor() as v:
        return v.notice(f"undo:{args['order_id']}", "compensated",
                        idempotency_key=ctx.idempotency_key)


def _payments(r: ModelRequest) -> ModelResponse:
    p = params(r)
    n = int(p.get("payments", 3))
    tool_name = p.get("tool", "pay")
    if r.lap > n:
        return turn(json.dumps({"paid": n}))
    amount = int(p.get("amount", 1000))
    if p.get("fail_at") == r.lap:
        amount = -1
    return turn(f"payment {r.lap}", [(tool_name, {"order_id": f"o{r.lap}",
                                                  "amount_cents": amount})])


register(Agent(name="payments", model=lambda: ScriptedModel(_payments), tools=[pay, book],
               window_messages=2000))


def _flaky(r: ModelRequest) -> ModelResponse:
    """Answers differently every call: only the journal keeps replays consistent."""
    p = params(r)
    if r.lap > int(p.get("laps", 3)):
        return turn("done")
    return turn("", [("pay", {"order_id": f"o{r.lap}-{random.randrange(10**9)}",
                              "amount_cents": 100})])


register(Agent(name="flaky-model", model=lambda: ScriptedModel(_flaky), tools=[pay],
               window_messages=2000))


@tool
def explode() -> None:
    """Always fails, like a poison lap."""
    raise RuntimeError("boom: this tool always fails")


register(Agent(name="poison", tools=[explode], window_messages=100,
               model=lambda: ScriptedModel(lambda r: turn("", [("explode", {})]))))


@tool(kind="irreversible")
def wire_money(account: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Irreversible: needs a human every time."""
    with _vendor() as v:
        return v.refund(account, amount_cents, idempotency_key=ctx.idempotency_key)


def _pauses(r: ModelRequest) -> ModelResponse:
    p = params(r)
    plan: list[list[Any]] = p.get("plan", [])
    if r.lap > len(plan):
        return turn(json.dumps({"laps": r.lap}))
    name, args = plan[r.lap - 1]
    return turn(f"step {r.lap}", [(name, args)])


register(Agent(name="pauses", model=lambda: ScriptedModel(_pauses),
               tools=[wire_money, sleep_tool, wait_for_signal_tool, step, book],
               window_messages=2000, approval_owner="ops"))
