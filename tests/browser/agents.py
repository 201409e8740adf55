"""The console's browser scenarios, as agents any worker process can run
(``AGENT_WORKER_AGENT_MODULES``): one waits for an approver before an
irreversible call, one gets a tool result holding a script, one fails at its
second lap. Each is scripted by its lap alone, so replays answer the same."""

from __future__ import annotations

import json
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.errors import ModelRefusalError
from agent_worker.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import tool

#: Who decides the gift: approvers who are also in this group.
APPROVERS = "gift-desk"
#: What the xss agent's tool hands back: it must show as text, never run.
SCRIPT_RESULT = ('<script>window.__pwned = 1; document.title = "pwned"</script>'
                 '<img src=x onerror="window.__pwned = 2" id="injected">')
REASONING = "The order arrived broken twice; a goodwill gift keeps this customer."
REFUSAL = "provider refused: the request looks like policy evasion"


@tool(kind="irreversible")
def send_gift(customer: str, amount_cents: int) -> dict[str, Any]:
    """Send a gift card to a customer; money leaves and cannot come back."""
    return {"sent": customer, "amount_cents": amount_cents}


@tool
def lookup_note(customer: str) -> str:
    """Read the note a customer left on their order (untrusted text)."""
    return f"note from {customer}: {SCRIPT_RESULT}"


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


register(Agent(name="console-gift", model=lambda: ScriptedModel(_gift), tools=[send_gift],
               approval_owner=APPROVERS))
register(Agent(name="console-xss", model=lambda: ScriptedModel(_xss), tools=[lookup_note]))
register(Agent(name="console-fails", model=lambda: ScriptedModel(_fails), tools=[lookup_note]))
