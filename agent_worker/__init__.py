"""agent-worker: long-running AI-agent runs, lap by lap, durable in Postgres,
driven by a Celery worker fleet. Import the public API from here.

Names load lazily (PEP 562): ``store`` and ``agent_worker`` import each other's
value modules, and importing one of them first must not drag in the other's
whole graph half-initialised."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_worker.agent import Agent, register, registry
    from agent_worker.api import (
        AgentWorker,
        approve,
        cancel,
        client,
        configure,
        fork,
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
    from agent_worker.errors import AgentWorkerError, TaskFailedError, ToolError
    from agent_worker.inprocess import InProcessWorker
    from agent_worker.messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
    from agent_worker.model import ModelClient, ScriptedModel, turn
    from agent_worker.tools import Tool, ToolContext, tool

_EXPORTS = {
    "Agent": "agent_worker.agent",
    "AgentWorker": "agent_worker.api",
    "AgentWorkerError": "agent_worker.errors",
    "Budget": "agent_worker.budget",
    "Checkpoint": "agent_worker.checkpoint",
    "InProcessWorker": "agent_worker.inprocess",
    "Message": "agent_worker.messages",
    "ModelClient": "agent_worker.model",
    "ModelRequest": "agent_worker.messages",
    "ModelResponse": "agent_worker.messages",
    "ScriptedModel": "agent_worker.model",
    "Tool": "agent_worker.tools",
    "ToolCall": "agent_worker.messages",
    "TaskFailedError": "agent_worker.errors",
    "ToolContext": "agent_worker.tools",
    "ToolError": "agent_worker.errors",
    "Usage": "agent_worker.messages",
    "approve": "agent_worker.api",
    "cancel": "agent_worker.api",
    "client": "agent_worker.api",
    "configure": "agent_worker.api",
    "fork": "agent_worker.api",
    "get_run": "agent_worker.api",
    "list_runs": "agent_worker.api",
    "register": "agent_worker.agent",
    "registry": "agent_worker.agent",
    "reject": "agent_worker.api",
    "retry": "agent_worker.api",
    "send_signal": "agent_worker.api",
    "sleep_tool": "agent_worker.control",
    "start_run": "agent_worker.api",
    "tool": "agent_worker.tools",
    "turn": "agent_worker.model",
    "wait": "agent_worker.api",
    "wait_for_signal_tool": "agent_worker.control",
}

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
    "TaskFailedError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "approve",
    "cancel",
    "client",
    "configure",
    "fork",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_worker' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
