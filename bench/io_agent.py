"""The IO-bound benchmark agent (``bench.iobound``): the workload of
``bench.agents`` with its model behind real HTTP, the OpenAI SDK talking to
``bench.io_provider`` at ``$AGENT_WORKER_BENCH_MODEL_URL``, so each lap waits
on its model call the way a real agent's does."""

from __future__ import annotations

import os

from agent_worker.agent import Agent, register
from agent_worker.core.budget import Budget
from agent_worker.model.openai_client import OpenAIChatModel
from bench.agents import read

IO_AGENT_NAME = "bench-io"


def _model() -> OpenAIChatModel:
    return OpenAIChatModel("io", base_url=os.environ["AGENT_WORKER_BENCH_MODEL_URL"],
                           api_key_env="AGENT_WORKER_BENCH_MODEL_KEY", max_retries=0,
                           timeout=30.0)


IO_AGENT = register(Agent(
    name=IO_AGENT_NAME, model=_model, tools=[read],
    instructions="Work through the plan, one note per lap.",
    budget=Budget(max_laps=100_000)))
