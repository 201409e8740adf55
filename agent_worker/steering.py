"""Reading and steering a run while it runs: labels
and their validation, the state query, operators' state edits and the check
of an approver's edited arguments. ``AgentWorker`` (``agent_worker.api``)
exposes these as verbs; they live here so the API module stays a list of verbs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from agent_worker.agent import Registry
from agent_worker.core.budget import Budget
from agent_worker.core.checkpoint import Checkpoint, PendingCall, PlanItem, load_checkpoint
from agent_worker.core.errors import InvalidInputError, UnknownRunError
from agent_worker.core.messages import Frozen
from agent_worker.core.runstate import StateDraft, edit_of
from agent_worker.core.settings import Settings
from agent_worker.core.untrusted import check_name, clean_text
from agent_worker.core.vocabulary import RunStatus
from agent_worker.store.base import ApprovalRecord
from agent_worker.store.state import RunState


def check_labels(labels: Mapping[str, str] | None, settings: Settings) -> dict[str, str]:
    """Labels as stored: keys are identifiers, values non-empty text without
    control characters (refused, not cleaned: a label is a search key, and a
    stored value must equal the one a later filter names), both at most
    ``max_label_chars``; at most ``max_labels`` of them.

    Raises:
        InvalidInputError: anything else.
    """
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidInputError("labels must be an object of key: value strings")
    if len(labels) > settings.max_labels:
        raise InvalidInputError(f"{len(labels)} labels; the limit is {settings.max_labels}")
    limit = settings.max_label_chars
    checked: dict[str, str] = {}
    for key, value in labels.items():
        check_name(key, "label key", max_chars=limit)
        if (not isinstance(value, str) or not value or len(value) > limit
                or clean_text(value) != value or any(ord(c) < 32 or ord(c) == 127
                                                     for c in value)):
            shown = repr(clean_text(value))[:80] if isinstance(value, str) else type(
                value).__name__
            raise InvalidInputError(
                f"label {key!r}: the value must be 1-{limit} characters of text without "
                f"control characters, got {shown}")
        checked[key] = value
    return checked


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """``["customer=acme-42", ...]`` (the CLI's ``--label``) as a mapping.

    Raises:
        InvalidInputError: an item without ``=``.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidInputError(f"label {item!r} must be KEY=VALUE")
        out[key] = value
    return out


class RunStateView(Frozen):
    """What ``get_state`` returns: the latest committed state of a run."""

    run_id: str
    status: RunStatus
    lap: int
    waiting_for: str | None
    labels: dict[str, str]
    plan: tuple[PlanItem, ...]
    next_action: str | None
    facts: dict[str, Any]
    budget: dict[str, Any]
    limits: Budget
    pending_calls: tuple[PendingCall, ...]
    pending_edits: int
    updated_at: datetime


def state_view(found: RunState | None, run_id: str) -> RunStateView:
    """``found`` (the store's one-query read) as the public view.

    Raises:
        UnknownRunError: no such run.
    """
    if found is None:
        raise UnknownRunError(f"unknown run {run_id!r}")
    ckpt: Checkpoint = load_checkpoint(found.checkpoint)
    run = found.run
    return RunStateView(
        run_id=run.id, status=run.status, lap=ckpt.lap, waiting_for=run.waiting_for,
        labels=run.labels or {}, plan=ckpt.plan, next_action=ckpt.next_action,
        facts=ckpt.facts, budget=ckpt.budget.model_dump(mode="json"),
        limits=Budget.of_run(run.limits), pending_calls=ckpt.pending_calls,
        pending_edits=found.pending_edits, updated_at=run.updated_at)


def state_edit(found: RunState | None, run_id: str, settings: Settings, *,
               plan: Sequence[str | Mapping[str, Any]] | None,
               facts: Mapping[str, Any] | None, note: str | None) -> dict[str, Any]:
    """An operator's edit, validated against the bounds and the run's latest
    committed state, as stored until the next lap applies it.

    Raises:
        UnknownRunError: no such run.
        StateLimitError: malformed or over a bound (nothing is stored).
    """
    if found is None:
        raise UnknownRunError(f"unknown run {run_id!r}")
    draft = StateDraft.of(load_checkpoint(found.checkpoint), settings)
    return edit_of(draft, plan=plan, facts=facts, note=note)


def argument_edit(registry: Registry, agent_of: Callable[[str], tuple[str, str]],
                  arguments: Mapping[str, Any]) -> Callable[[ApprovalRecord], dict[str, Any]]:
    """The check ``decide_approval`` runs on the approval it decides: the
    edited ``arguments`` must fit the tool's schema (the pydantic model the
    model's own arguments are validated with), and are stored as validated.

    Raises (from the returned function):
        InvalidInputError: the arguments do not fit the tool, or its agent
            version is not registered here.
    """
    def check(approval: ApprovalRecord) -> dict[str, Any]:
        name, version = agent_of(approval.run_id)
        tool = registry.get(name, version).tool(approval.tool_name)
        if tool is None:
            raise InvalidInputError(f"tool {approval.tool_name!r} is not in {name}@{version}")
        if not isinstance(arguments, Mapping):
            raise InvalidInputError("arguments must be an object")
        try:
            validated = tool.validate(dict(arguments))
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'arguments'}: {x['msg']}"
                                 for x in e.errors())
            raise InvalidInputError(
                f"edited arguments do not fit {tool.name}'s schema: {problems}") from e
        edited: dict[str, Any] = validated.model_dump(mode="json")
        return edited

    return check


__all__ = ["RunStateView", "argument_edit", "check_labels", "parse_labels", "state_edit",
           "state_view"]
