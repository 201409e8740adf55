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
from tests.agents import _find_charge, _payments, _vendor, charge_checked


@tool(kind="idempotent")
def charge_idem(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A payment through a vendor that honours idempotency keys and can be asked by key."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


# The vendor answers by key whatever the tool: the same lookup as charge_checked's.
charge_idem.lookup(_find_charge)


register(Agent(name="ledger-charges", model=lambda: ScriptedModel(_payments),
               tools=[charge_idem, charge_checked], window_messages=2000))
