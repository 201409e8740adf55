"""Built-in tools with which an agent writes its own run state: its
plan and progress, its next planned action, pinned facts.

Opt in per agent: ``Agent(tools=[..., *state_tools])``. The engine handles
them itself (like ``sleep``): no side effect, no ledger row; the write is
applied to the lap's checkpoint by the lap's fenced commit. They are
replay-safe because the calls come from the journaled model output, so a
replayed lap makes the same writes to the same starting checkpoint. Facts and
the plan are shown to the model in every lap's system context and survive
compaction (they live in the checkpoint, not in the messages).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent_worker.tools import Tool, tool


def _set_plan(steps: list[str]) -> None:
    """Replace your plan with these steps, in order (all not done yet)."""


def _mark_step(step: int, done: bool = True) -> None:
    """Mark step `step` of your plan (1-based, as numbered in the plan) done or not done."""


def _set_next_action(action: str) -> None:
    """Record the next action you plan to take (shown to you and to operators)."""


def _pin_fact(key: str, value: Any = None) -> None:
    """Pin a fact you must not forget (kept in your instructions in every later turn,
    even after older messages are summarised); value null unpins it."""


def _state(fn: Any, name: str) -> Tool:
    return replace(tool(name=name)(fn), control="state")


set_plan_tool = _state(_set_plan, "set_plan")
mark_step_tool = _state(_mark_step, "mark_step")
set_next_action_tool = _state(_set_next_action, "set_next_action")
pin_fact_tool = _state(_pin_fact, "pin_fact")

#: All four, to spread into an agent's tools.
state_tools: tuple[Tool, ...] = (set_plan_tool, mark_step_tool, set_next_action_tool,
                                 pin_fact_tool)

__all__ = ["mark_step_tool", "pin_fact_tool", "set_next_action_tool", "set_plan_tool",
           "state_tools"]
