"""Agents for the ledger-after-ending tests (tests/integration/test_ledger_after_ending.py),
registered in worker processes beside ``tests.agents`` through
``AGENT_WORKER_AGENT_MODULES``: ``ledger-charges`` pays like ``charges``, with
an idempotent charge that can also be looked up by key (``charge_idem``) and the
compensatable, looked-up ``charge_checked``."""

from __future__ import annotations

from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.model.scripted import ScriptedModel
from agent_worker.tools import ToolContext, tool
from tests.agents import _payments, _vendor, charge_checked


@tool(kind="idempotent")
def charge_idem(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A payment through a vendor that honours idempotency keys and can be asked by key."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@charge_idem.lookup
def _find_idem(key: str) -> dict[str, Any] | None:
    """What the vendor recorded under ``key``: adopted as the call's result."""
    with _vendor() as v:
        found = v.lookup(key)
    if found is None or int(found["status"]) >= 400:
        return None
    response: dict[str, Any] = found["response"]
    return response


register(Agent(name="ledger-charges", model=lambda: ScriptedModel(_payments),
               tools=[charge_idem, charge_checked], window_messages=2000))
