"""The benchmark agent, registered in every process that runs bench laps
(``AGENT_WORKER_AGENT_MODULES=bench.agents`` for Celery workers).

The scripted model answers from the run id (which encodes the run length) and
the lap number alone, so every worker process answers identically, whatever
window it was given.
"""

from __future__ import annotations

import os
import time

from agent_worker.agent import Agent, register
from agent_worker.core.budget import Budget
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import tool
from bench.workload import AGENT_NAME, TOOL_NAME, USAGE, lap_spec, laps_of, tool_output


@tool(name=TOOL_NAME)
def read(path: str) -> str:
    """Read a note (does nothing: returns fixed text)."""
    # Only the recovery benchmark sets this: it needs a lap slow enough to kill mid-way.
    pause = float(os.environ.get("AGENT_WORKER_BENCH_TOOL_SLEEP") or 0)
    if pause:
        time.sleep(pause)
    return tool_output(path)


def script(request: ModelRequest) -> ModelResponse:
    spec = lap_spec(request.lap, laps_of(request.run_id))
    calls = [] if spec.call_args is None else [(TOOL_NAME, spec.call_args)]
    return turn(spec.text, calls, usage=USAGE)


BENCH_AGENT = register(Agent(
    name=AGENT_NAME, model=lambda: ScriptedModel(script), tools=[read],
    instructions="Work through the plan, one note per lap.",
    budget=Budget(max_laps=100_000)))
