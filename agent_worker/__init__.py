"""agent-worker: long-running AI-agent runs, lap by lap, durable in Postgres,
driven by a Celery worker fleet. Import the public API from here.

Names load lazily (PEP 562): ``store`` and ``agent_worker`` import each other's
value modules, and importing one of them first must not drag in the other's
whole graph half-initialised."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_worker import moved

moved.install()

if TYPE_CHECKING:  # explicit re-exports (``X as X``) for type checkers
    from agent_worker.agent import Agent as Agent
    from agent_worker.agent import register as register
    from agent_worker.agent import registry as registry
    from agent_worker.api import AgentWorker as AgentWorker
    from agent_worker.api import approve as approve
    from agent_worker.api import cancel as cancel
    from agent_worker.api import client as client
    from agent_worker.api import configure as configure
    from agent_worker.api import connect as connect
    from agent_worker.api import delete_schedule as delete_schedule
    from agent_worker.api import fork as fork
    from agent_worker.api import get_run as get_run
    from agent_worker.api import get_state as get_state
    from agent_worker.api import list_runs as list_runs
    from agent_worker.api import list_schedules as list_schedules
    from agent_worker.api import pause_schedule as pause_schedule
    from agent_worker.api import reject as reject
    from agent_worker.api import resume_schedule as resume_schedule
    from agent_worker.api import retry as retry
    from agent_worker.api import schedule as schedule
    from agent_worker.api import search_runs as search_runs
    from agent_worker.api import send_signal as send_signal
    from agent_worker.api import start_child as start_child
    from agent_worker.api import start_run as start_run
    from agent_worker.api import stream as stream
    from agent_worker.api import trigger_schedule as trigger_schedule
    from agent_worker.api import update_state as update_state
    from agent_worker.api import wait as wait
    from agent_worker.children import Child as Child
    from agent_worker.children import StartChildren as StartChildren
    from agent_worker.control import sleep_tool as sleep_tool
    from agent_worker.control import wait_for_signal_tool as wait_for_signal_tool
    from agent_worker.core.authorization import AccessRequest as AccessRequest
    from agent_worker.core.authorization import RoleAuthorizer as RoleAuthorizer
    from agent_worker.core.budget import Budget as Budget
    from agent_worker.core.checkpoint import Checkpoint as Checkpoint
    from agent_worker.core.errors import AgentWorkerError as AgentWorkerError
    from agent_worker.core.errors import PermissionDeniedError as PermissionDeniedError
    from agent_worker.core.errors import RetryableToolError as RetryableToolError
    from agent_worker.core.errors import TaskFailedError as TaskFailedError
    from agent_worker.core.errors import ToolError as ToolError
    from agent_worker.core.errors import ToolTimeoutError as ToolTimeoutError
    from agent_worker.core.messages import Message as Message
    from agent_worker.core.messages import ModelRequest as ModelRequest
    from agent_worker.core.messages import ModelResponse as ModelResponse
    from agent_worker.core.messages import ToolCall as ToolCall
    from agent_worker.core.messages import Usage as Usage
    from agent_worker.core.principal import Principal as Principal
    from agent_worker.inprocess import InProcessWorker as InProcessWorker
    from agent_worker.model import ModelClient as ModelClient
    from agent_worker.model import ScriptedModel as ScriptedModel
    from agent_worker.model import turn as turn
    from agent_worker.shareapi import QueueView as QueueView
    from agent_worker.shareapi import UnknownShareLimitError as UnknownShareLimitError
    from agent_worker.state_toolkit import state_tools as state_tools
    from agent_worker.streaming import StreamEvent as StreamEvent
    from agent_worker.tools import Tool as Tool
    from agent_worker.tools import ToolContext as ToolContext
    from agent_worker.tools import tool as tool

#: The public API: each name and the module it comes from. ``__all__`` and the
#: lazy lookup below are derived from it; the ``TYPE_CHECKING`` imports above
#: are its static mirror for type checkers (tests/unit/test_exports.py keeps
#: the two equal).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "agent_worker.agent": ("Agent", "register", "registry"),
    "agent_worker.api": ("AgentWorker", "approve", "cancel", "client", "configure", "connect",
                         "fork", "get_run", "get_state", "list_runs", "reject", "retry",
                         "search_runs", "send_signal", "start_child", "start_run", "stream",
                         "update_state", "wait",
                         # durable schedules
                         "delete_schedule", "list_schedules", "pause_schedule",
                         "resume_schedule", "schedule", "trigger_schedule"),
    "agent_worker.core.authorization": ("AccessRequest", "RoleAuthorizer"),
    "agent_worker.core.budget": ("Budget",),
    "agent_worker.core.checkpoint": ("Checkpoint",),
    "agent_worker.children": ("Child", "StartChildren"),
    "agent_worker.control": ("sleep_tool", "wait_for_signal_tool"),
    "agent_worker.core.errors": ("AgentWorkerError", "PermissionDeniedError", "RetryableToolError",
                            "TaskFailedError", "ToolError", "ToolTimeoutError"),
    "agent_worker.inprocess": ("InProcessWorker",),
    "agent_worker.core.messages": ("Message", "ModelRequest", "ModelResponse", "ToolCall", "Usage"),
    "agent_worker.model": ("ModelClient", "ScriptedModel", "turn"),
    "agent_worker.core.principal": ("Principal",),
    "agent_worker.state_toolkit": ("state_tools",),
    "agent_worker.streaming": ("StreamEvent",),
    "agent_worker.shareapi": ("QueueView", "UnknownShareLimitError"),
    "agent_worker.tools": ("Tool", "ToolContext", "tool"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
