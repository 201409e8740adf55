"""agent-worker: long-running AI-agent runs, lap by lap, durable in Postgres,
driven by a Celery worker fleet. Import the public API from here."""

from agent_worker.agent import Agent, register, registry
from agent_worker.api import (
    AgentWorker,
    approve,
    cancel,
    client,
    configure,
    get_run,
    list_runs,
    reject,
    retry,
    send_signal,
    start_run,
    wait,
)
from agent_worker.budget import Budget
from agent_worker.checkpoint import Checkpoint
from agent_worker.control import sleep_tool, wait_for_signal_tool
from agent_worker.errors import AgentWorkerError, ToolError
from agent_worker.inprocess import InProcessWorker
from agent_worker.messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
from agent_worker.model import ModelClient, ScriptedModel, turn
from agent_worker.tools import Tool, ToolContext, tool

__all__ = [
    "Agent",
    "AgentWorker",
    "AgentWorkerError",
    "Budget",
    "Checkpoint",
    "InProcessWorker",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "approve",
    "cancel",
    "client",
    "configure",
    "get_run",
    "list_runs",
    "register",
    "registry",
    "reject",
    "retry",
    "send_signal",
    "sleep_tool",
    "start_run",
    "tool",
    "turn",
    "wait",
    "wait_for_signal_tool",
]
