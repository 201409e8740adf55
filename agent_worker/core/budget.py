"""Budget limits (on the run, so a human can raise them) and the usage ledger
(in the checkpoint, so it advances exactly once per committed lap).

A lap's usage is journaled with its model output before any tool runs; a replayed
lap reuses that output and charges nothing new, so a crash never refunds the
budget and never double-charges it. The one gap: a worker killed after the
provider answered and before the journal commit loses that call's usage, so a run
killed repeatedly can overspend by at most one lap's worth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from pydantic import ValidationInfo, field_validator

from agent_worker.core.errors import BudgetExceededError, InvalidInputError
from agent_worker.core.messages import Frozen, Usage

_LIMITS = ("max_laps", "max_input_tokens", "max_output_tokens", "max_cost", "max_wall_seconds")

MAX_WALL_SECONDS = 100 * 365 * 24 * 3600
"""The longest wall-clock limit a run may have (about 100 years): a run's
deadline is its start plus this, and must be a date."""

_STORED = {"stored": True}


class Budget(Frozen):
    """Limits of one run; ``None`` means unlimited."""

    max_laps: int | None = 200
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost: Decimal | None = None
    max_wall_seconds: float | None = None
    on_exceed: Literal["fail", "pause"] = "fail"

    @field_validator(*_LIMITS)
    @classmethod
    def _a_limit_a_run_can_meet(cls, value: Any, info: ValidationInfo) -> Any:
        """A negative limit made a run that failed (or paused) before its
        first lap, and a wall limit of NaN, infinity or past year 9999 failed
        ``start_run`` with a bare ``ValueError``: refused here, where a
        caller, an agent or ``raise_budget`` gives them. Limits read back
        from a run (``of_run``) are taken as stored, so a run an older
        release admitted stays readable and can still be raised."""
        if value is None or info.context == _STORED:
            return value
        if value < 0:
            raise InvalidInputError(f"budget: {info.field_name} must be at least 0, not {value}")
        if info.field_name == "max_wall_seconds" and not (
                math.isfinite(value) and value <= MAX_WALL_SECONDS):
            raise InvalidInputError(
                f"budget: max_wall_seconds must be a number of seconds up to {MAX_WALL_SECONDS}")
        return value

    @classmethod
    def of_run(cls, limits: Mapping[str, Any]) -> Budget:
        """A run's limits as stored on its row."""
        return cls.model_validate(limits, context=_STORED)

    def tightened_by(self, caller: Budget | None) -> Budget:
        """The agent's limits (``self``) narrowed by a caller's: each limit is the
        stricter of the two. A caller can only tighten: a limit it leaves out or
        sets to ``None`` means "no tighter", never "unlimited" (so
        ``Budget(max_laps=None)`` from a caller cannot lift the agent's lap cap).
        ``on_exceed`` is the caller's when it sets one: pausing spends nothing
        more than failing does until an operator raises the budget."""
        if caller is None:
            return self
        update: dict[str, object] = {}
        for name in _LIMITS:
            theirs = getattr(caller, name) if name in caller.model_fields_set else None
            ours = getattr(self, name)
            if theirs is not None:
                update[name] = theirs if ours is None else min(ours, theirs)
        if "on_exceed" in caller.model_fields_set:
            update["on_exceed"] = caller.on_exceed
        return self.model_copy(update=update)


class BudgetLedger(Frozen):
    """What a run has spent so far; only ever grows."""

    laps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    started_at: datetime
    deadline: datetime | None = None

    @classmethod
    def start(cls, budget: Budget, now: datetime) -> BudgetLedger:
        """A fresh ledger whose deadline follows from the wall-clock limit."""
        deadline = (
            now + timedelta(seconds=budget.max_wall_seconds)
            if budget.max_wall_seconds is not None
            else None
        )
        return cls(started_at=now, deadline=deadline)

    def charge(self, usage: Usage, cost: Decimal) -> BudgetLedger:
        """The ledger after one more lap that used ``usage`` and cost ``cost``."""
        return self.model_copy(
            update={
                "laps": self.laps + 1,
                "input_tokens": self.input_tokens + usage.input_tokens,
                "output_tokens": self.output_tokens + usage.output_tokens,
                "cost": self.cost + cost,
            }
        )

    def check(self, budget: Budget, now: datetime) -> None:
        """Raise ``BudgetExceededError`` if another model call would break a limit."""
        reason = self.exceeded(budget, now)
        if reason is not None:
            raise BudgetExceededError(reason)

    def exceeded(self, budget: Budget, now: datetime) -> str | None:
        """Why the next lap may not start, or ``None`` if it may."""
        checks: list[tuple[bool, str]] = [
            (budget.max_laps is not None and self.laps >= budget.max_laps,
             f"lap budget spent: {self.laps} of {budget.max_laps} laps"),
            (budget.max_input_tokens is not None and self.input_tokens >= budget.max_input_tokens,
             f"input-token budget spent: {self.input_tokens} of {budget.max_input_tokens}"),
            (budget.max_output_tokens is not None
             and self.output_tokens >= budget.max_output_tokens,
             f"output-token budget spent: {self.output_tokens} of {budget.max_output_tokens}"),
            (budget.max_cost is not None and self.cost >= budget.max_cost,
             f"cost budget spent: {self.cost} of {budget.max_cost}"),
            (self.deadline is not None and now >= self.deadline,
             f"deadline passed: {self.deadline.isoformat() if self.deadline else ''}"),
        ]
        return next((reason for hit, reason in checks if hit), None)
