"""The agents the console's tests run, both in-process (``tests/console``) and
on a real fleet in a browser (``tests/browser``). Each is scripted by its lap
alone, so replays answer the same.

Two ways in, one set of definitions:

- worker processes import this module by name (``AGENT_WORKER_AGENT_MODULES=
  tests.console.agents``, as ``tests/browser/conftest.py`` sets it): importing
  it registers the fleet's agents (``console-*``) in the global registry, the
  only way a subprocess learns an agent;
- in-process tests take ``registry()``: a fresh registry per test holding every
  agent here, so the flaky model's first-call hiccup happens in every test and
  the short names (``refunds``, ``charges``) never meet ``tests.agents``' ones.

The agents: one waits for an approver before an irreversible refund (and a
gift, for a group of approvers); one's tool result holds a script a page must
show as text; one fails at its second lap; one's model hiccups once; one's
card charge loses its answer, leaving the effect unknown for a human; one
pauses on its budget after one lap; one stamps a record with an idempotent
call (the browser tests kill its worker right after the stamp lands).
"""

from __future__ import annotations

import json
from typing import Any

from agent_worker.agent import Agent, Registry, register
from agent_worker.core.budget import Budget
from agent_worker.core.errors import ModelRefusalError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool

#: What the refund tool returns: a script a page must show as text.
HOSTILE = "<script>document.title='pwned'</script>"
#: Who decides the gift: approvers who are also in this group.
APPROVERS = "gift-desk"
#: What the xss agent's tool hands back: it must show as text, never run.
SCRIPT_RESULT = ('<script>window.__pwned = 1; document.title = "pwned"</script>'
                 '<img src=x onerror="window.__pwned = 2" id="injected">')
REASONING = "The order arrived broken twice; a goodwill gift keeps this customer."
REFUSAL = "provider refused: the request looks like policy evasion"


@tool(kind="irreversible")
def refund(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order to the customer's card; money leaves the company."""
    return {"refunded": amount_cents, "note": HOSTILE}


@tool
def look(order_id: str) -> str:
    """Read an order."""
    return f"order {order_id}: double charged {HOSTILE}"


@tool(kind="irreversible")
def send_gift(customer: str, amount_cents: int) -> dict[str, Any]:
    """Send a gift card to a customer; money leaves and cannot come back."""
    return {"sent": customer, "amount_cents": amount_cents}


@tool
def lookup_note(customer: str) -> str:
    """Read the note a customer left on their order (untrusted text)."""
    return f"note from {customer}: {SCRIPT_RESULT}"


@tool(kind="idempotent")
def stamp(record: str, ctx: ToolContext) -> dict[str, str]:
    """Stamp a record as seen; the same key stamps it once."""
    return {"stamped": record, "key": ctx.idempotency_key}


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


def _refunds(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("The customer was charged twice for order 7; I will refund one charge.",
                    [("look", {"order_id": "7"})])
    if r.lap == 2:
        return turn("Refunding the duplicate charge of order 7.",
                    [("refund", {"order_id": "7", "amount_cents": 1500})])
    return turn("done")


def _charges(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("Charging order 9.", [("charge", {"order_id": "9", "amount_cents": 700})])
    return turn("charged")


def _gift(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn(REASONING, [("send_gift", {"customer": "c-42", "amount_cents": 2500})])
    return turn(json.dumps({"gift": "sent"}))


def _xss(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("Reading the customer's note.", [("lookup_note", {"customer": "c-7"})])
    return turn("The note is read.")


def _fails(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("Looking first.", [("lookup_note", {"customer": "c-9"})])
    raise ModelRefusalError(REFUSAL)


def _stamps(r: ModelRequest) -> ModelResponse:
    if r.lap == 1:
        return turn("Stamping the record first.", [("stamp", {"record": "r-1"})])
    return turn("stamped")


def _flaky() -> ScriptedModel:
    """Fails the first attempt of lap 1, like a provider's hiccup; then finishes."""
    calls = {"n": 0}

    def script(r: ModelRequest) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("provider hiccup")
        return turn("recovered")

    return ScriptedModel(script)


def _fleet_agents() -> list[Agent]:
    """The agents a worker process runs for the browser tests."""
    return [Agent(name="console-gift", model=lambda: ScriptedModel(_gift), tools=[send_gift],
                  approval_owner=APPROVERS),
            Agent(name="console-xss", model=lambda: ScriptedModel(_xss), tools=[lookup_note]),
            Agent(name="console-fails", model=lambda: ScriptedModel(_fails),
                  tools=[lookup_note]),
            Agent(name="console-budget", model=lambda: ScriptedModel(_xss), tools=[lookup_note],
                  budget=Budget(max_laps=1, on_exceed="pause")),
            Agent(name="console-stamp", model=lambda: ScriptedModel(_stamps), tools=[stamp])]


def registry() -> Registry:
    """A fresh registry of every agent here, for one in-process test."""
    reg = Registry()
    reg.register(Agent(name="refunds", model=lambda: ScriptedModel(_refunds),
                       tools=[look, refund], approval_owner="approver"))
    reg.register(Agent(name="charges", model=lambda: ScriptedModel(_charges), tools=[charge]))
    flaky = _flaky()
    reg.register(Agent(name="flaky", model=lambda: flaky))
    for agent in _fleet_agents():
        reg.register(agent)
    return reg


for _agent in _fleet_agents():
    register(_agent)
