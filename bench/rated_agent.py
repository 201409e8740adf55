"""The rate-limit benchmark's agent (``bench.ratelimit``), registered in every
process that runs its laps (``AGENT_WORKER_AGENT_MODULES=bench.rated_agent``).

A real OpenAI client against the loopback fake provider at
``AGENT_WORKER_TEST_LLM_URL``, on provider key ``fake-key``, with no SDK
retries: a 429 reaches the engine at once, which pauses the key fleet-wide
(``fairshare.rate_limited``) instead of a worker sleeping in the SDK.
"""

from __future__ import annotations

import os
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.core.budget import Budget
from agent_worker.tools import tool

AGENT = "rated"
PROVIDER_KEY = "fake-key"
#: Laps per run: every lap but the last calls ``note``.
LAPS = 20


@tool
def note(n: int) -> int:
    """Write down a number (does nothing)."""
    return n


def script() -> list[dict[str, Any]]:
    """The fake provider's turns: 900, 1,000 or 1,100 tokens a lap, so the
    admission estimate (a run's mean so far) is off and the correction counts."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "note", "arguments": {"n": k}}],
         "usage": {"input": 700 + 100 * (k % 3), "output": 200}} for k in range(LAPS - 1)]
    turns.append({"text": "done", "usage": {"input": 800, "output": 200}})
    return turns


def _client() -> Any:
    from agent_worker.model.openai_client import OpenAIChatModel

    return OpenAIChatModel("gpt-4o-mini", base_url=os.environ["AGENT_WORKER_TEST_LLM_URL"]
                           + "/v1", max_retries=0)


register(Agent(name=AGENT, model=_client, tools=[note], window_messages=200,
               provider_key=PROVIDER_KEY, budget=Budget(max_laps=LAPS + 5)))
