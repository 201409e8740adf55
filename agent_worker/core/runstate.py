"""The state an agent (or an operator) writes into its run: plan and progress,
the next planned action, pinned facts.

Everything here is a pure function of the checkpoint it starts from and the
writes applied to it, which is what makes it replay-safe: a lap's writes come
from its journaled model output (state tools) or from read tools that run
again on replay, so a replayed lap rebuilds the same state and the fenced
commit stores it once. Sizes are bounded (settings ``max_plan_items``,
``max_state_text_chars``, ``max_facts``, ``max_facts_bytes``) because facts
and plan are in every lap's system context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_worker.core.checkpoint import Checkpoint, PlanItem
from agent_worker.core.errors import InvalidInputError, StateLimitError
from agent_worker.core.settings import Settings
from agent_worker.core.untrusted import check_name, check_text, clean


@dataclass
class StateDraft:
    """The run's plan, next action and facts as one lap (or edit) changes them."""

    settings: Settings
    plan: list[PlanItem] = field(default_factory=list)
    next_action: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    changed: bool = False

    @classmethod
    def of(cls, ckpt: Checkpoint, settings: Settings) -> StateDraft:
        return cls(settings, list(ckpt.plan), ckpt.next_action, dict(ckpt.facts))

    def bounded_text(self, value: object, what: str) -> str:
        """``value`` cleaned, if it is text within ``max_state_text_chars``."""
        return check_text(value, what, max_chars=self.settings.max_state_text_chars)

    def set_plan(self, items: Sequence[str | Mapping[str, Any]]) -> None:
        """Replace the plan: titles (not done) or ``{"title": ..., "done": bool}``."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise StateLimitError("plan must be a list of steps")
        if len(items) > self.settings.max_plan_items:
            raise StateLimitError(f"plan has {len(items)} steps; the limit is "
                                  f"{self.settings.max_plan_items}")
        plan: list[PlanItem] = []
        for i, item in enumerate(items, 1):
            if isinstance(item, Mapping):
                done = item.get("done", False)
                if not isinstance(done, bool) or set(item) - {"title", "done"}:
                    raise StateLimitError(f"plan step {i}: only 'title' and a boolean "
                                          "'done' are allowed")
                plan.append(PlanItem(title=self.bounded_text(item.get("title"), f"plan step {i}"),
                                     done=done))
            else:
                plan.append(PlanItem(title=self.bounded_text(item, f"plan step {i}")))
        self.plan, self.changed = plan, True

    def mark_step(self, step: int, done: bool = True) -> None:
        """Mark plan step ``step`` (1-based, as the model sees the plan)."""
        if isinstance(step, bool) or not isinstance(step, int) or not (
                1 <= step <= len(self.plan)):
            raise StateLimitError(f"no plan step {step!r}; the plan has {len(self.plan)} steps")
        self.plan[step - 1] = self.plan[step - 1].model_copy(update={"done": bool(done)})
        self.changed = True

    def set_next_action(self, text: str | None) -> None:
        """Record (or with ``None`` clear) what the agent means to do next."""
        self.next_action = None if text is None else self.bounded_text(text, "next action")
        self.changed = True

    def pin_fact(self, key: str, value: Any) -> None:
        """Pin ``key`` (an identifier) to a JSON ``value``; ``None`` unpins it."""
        self.merge_facts({key: value})

    def merge_facts(self, facts: Mapping[str, Any]) -> None:
        """Pin each key; a ``None`` value unpins it. All or nothing."""
        if not isinstance(facts, Mapping):
            raise StateLimitError("facts must be an object of key: value")
        merged = dict(self.facts)
        for key, value in facts.items():
            try:
                check_name(key, "fact key", max_chars=100)
            except InvalidInputError as e:
                raise StateLimitError(str(e)) from e
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = clean(value, max_depth=self.settings.max_json_depth,
                                    what="fact", strict=True)
        if len(merged) > self.settings.max_facts:
            raise StateLimitError(f"{len(merged)} pinned facts; the limit is "
                                  f"{self.settings.max_facts}")
        size = len(json.dumps(merged, sort_keys=True))
        if size > self.settings.max_facts_bytes:
            raise StateLimitError(f"pinned facts would be {size} bytes; the limit is "
                                  f"{self.settings.max_facts_bytes}")
        self.facts, self.changed = merged, True

    def apply_to(self, ckpt: Checkpoint) -> Checkpoint:
        """``ckpt`` carrying this state (unchanged when nothing was written)."""
        if not self.changed:
            return ckpt
        return ckpt.model_copy(update={"plan": tuple(self.plan), "facts": dict(self.facts),
                                       "next_action": self.next_action})


__all__ = ["StateDraft"]


def edit_of(draft: StateDraft, *, plan: Sequence[str | Mapping[str, Any]] | None,
            facts: Mapping[str, Any] | None, note: str | None) -> dict[str, Any]:
    """An operator's edit, validated against the bounds and ``draft`` (the
    latest committed state), in the form stored until a lap applies it.

    Raises:
        StateLimitError: a plan, fact or note is malformed or over its bound.
    """
    edit: dict[str, Any] = {}
    if plan is not None:
        draft.set_plan(plan)
        edit["plan"] = [p.model_dump() for p in draft.plan]
    if facts is not None:
        cleaned = {k: None if v is None else clean(v, max_depth=draft.settings.max_json_depth,
                                                   what="fact", strict=True)
                   for k, v in facts.items()} if isinstance(facts, Mapping) else facts
        draft.merge_facts(cleaned)
        edit["facts"] = cleaned
    if note is not None:
        edit["note"] = draft.bounded_text(note, "note")
    if not edit:
        raise StateLimitError("nothing to update: give plan, facts or a note")
    return edit


def apply_edit(draft: StateDraft, edit: Mapping[str, Any]) -> None:
    """Apply a stored edit (validated when it was requested). Never raises for
    a bound: a lap must not fail for good because an edit that was within the
    limits then no longer fits (facts the agent pinned since); the facts are
    then over the bound until the next write shrinks them."""
    if "plan" in edit:
        draft.plan = [PlanItem.model_validate(p) for p in edit["plan"]]
    if "facts" in edit:
        for key, value in edit["facts"].items():
            if value is None:
                draft.facts.pop(key, None)
            else:
                draft.facts[key] = value
    draft.changed = True


__all__ += ["apply_edit", "edit_of"]
