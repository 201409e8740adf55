"""What a tool returns to start child runs and wait for them.

A tool cannot block until other runs finish: it returns ``StartChildren``
(``ctx.start_children(...)`` builds one) and the engine does the rest. It
starts the children exactly once (their ids derive from the call's key
``run:lap:call``, so a replayed lap finds the ones it already started), parks
the parent as a ``waiting`` row, and when the children are done hands the
model their results, or their errors, as this call's result.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agent_worker.core.budget import Budget
from agent_worker.core.messages import Frozen
from agent_worker.core.vocabulary import ChildWait


class Child(Frozen):
    """One child run to start: an agent (at ``version``, else its current
    one), its input, and optionally limits tighter than its share of the
    parent's remaining budget."""

    agent: str
    input: Any = None
    version: str | None = None
    budget: Budget | None = None


class StartChildren(Frozen):
    """Start ``children`` and wait for ``all`` of them or for ``any`` (the first)."""

    children: tuple[Child, ...] = Field(min_length=1)
    wait: ChildWait = "all"


__all__ = ["Child", "StartChildren"]
