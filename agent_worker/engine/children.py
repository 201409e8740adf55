"""Child runs from a lap's point of view: start them exactly once,
see whether the wait is over, collect their results, charge their spend, and
cancel them when the parent ends.

The call that starts children is an effect like any other, keyed
``run:lap:call``; its recorded result is a small marker naming the group (that
key) and the wait mode, not the children's results. So a replay of the lap
finds the marker, and a lap that resumes the parent reads the children's rows
afresh. Child ids derive from the key and the child's place in the call's list:
a replay that asks again creates nothing new (``store.children``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agent_worker.children import Child, StartChildren
from agent_worker.core.budget import MAX_WALL_SECONDS, Budget, BudgetLedger
from agent_worker.core.checkpoint import load_checkpoint
from agent_worker.core.errors import ChildLimitError
from agent_worker.core.untrusted import reduced
from agent_worker.core.vocabulary import TERMINAL, ChildWait, WaitingFor
from agent_worker.engine.newrun import admitted_run
from agent_worker.runtime import Runtime
from agent_worker.store.base import Claim, DueLap, NewRun, RunRecord

#: The key of the marker a children call records as its result.
MARKER = "__children__"


@dataclass(frozen=True)
class Collected:
    """The wait is over: what the model is told, and what the children spent
    (input tokens, output tokens, cost in micros) to charge to the parent."""

    result: dict[str, Any]
    spent: tuple[int, int, int]


def child_id(group_key: str, position: int) -> str:
    """The child's run id, derived from the work (never from the attempt); a
    hash when the readable form would pass the 200-character id limit."""
    readable = f"{group_key}:{position}"
    if len(readable) <= 200:
        return readable
    return "child-" + hashlib.sha256(readable.encode()).hexdigest()[:40]


def is_marker(value: Any) -> bool:
    return isinstance(value, dict) and MARKER in value


def begin(rt: Runtime, claim: Claim, group_key: str, request: StartChildren
          ) -> dict[str, Any]:
    """Start the children of one call (those not started yet), send their
    first laps, and return the marker to record as the call's result.

    Raises (before anything is written, except the limits checked in the store):
        ChildLimitError, UnknownAgentError, InvalidInputError, PayloadTooLargeError.
    """
    s = rt.settings
    count = len(request.children)
    if count > s.max_children_per_call:
        raise ChildLimitError(
            f"{count} children asked for in one call; the limit is "
            f"{s.max_children_per_call} (AGENT_WORKER_MAX_CHILDREN_PER_CALL)")
    share = budget_share(claim.run.limits, load_checkpoint(claim.checkpoint).budget, count)
    now = rt.clock.now()
    new = [_new_child(rt, claim.run, child, child_id(group_key, i), share)
           for i, child in enumerate(request.children)]
    due = rt.store.start_children(claim.run.id, group_key, new, now=now, owner=claim.owner,
                                  max_depth=s.max_child_depth,
                                  max_per_run=s.max_children_per_run)
    rt.send_all(due)
    return {MARKER: group_key, "wait": request.wait, "count": count}


def _new_child(rt: Runtime, parent: RunRecord, child: Child, run_id: str,
               share: Budget) -> NewRun:
    spec = rt.registry.get(child.agent, child.version)
    limits = spec.budget.tightened_by(share).tightened_by(child.budget)
    return admitted_run(rt, spec, child.input, run_id=run_id, tenant=parent.tenant, limits=limits)


def budget_share(parent_limits: dict[str, Any], spent: BudgetLedger, count: int) -> Budget:
    """Each of ``count`` children's share of what the parent has left: its
    remaining tokens and cost split evenly, and its deadline. Limits the parent
    lacks stay unset."""
    limits = Budget.of_run(parent_limits)
    share: dict[str, Any] = {}
    if limits.max_input_tokens is not None:
        share["max_input_tokens"] = max(limits.max_input_tokens - spent.input_tokens, 0) // count
    if limits.max_output_tokens is not None:
        share["max_output_tokens"] = max(
            limits.max_output_tokens - spent.output_tokens, 0) // count
    if limits.max_cost is not None:
        left = max(limits.max_cost - spent.cost, Decimal(0)) / count
        share["max_cost"] = left.quantize(Decimal("0.000001"))
    if spent.deadline is not None:  # a parent an older release admitted may outlast the cap
        share["max_wall_seconds"] = min(max(
            (spent.deadline - spent.started_at).total_seconds(), 0.0), MAX_WALL_SECONDS)
    return Budget(**share)


def outcome(rt: Runtime, marker: dict[str, Any]) -> Collected | WaitingFor:
    """The children's results if the wait is over, else what to wait for."""
    group = str(marker[MARKER])
    mode: ChildWait = "any" if marker.get("wait") == "any" else "all"
    kids = [run for _, run in rt.store.list_children(group_key=group)]
    ended = [r for r in kids if r.status in TERMINAL]
    if not kids or (mode == "all" and len(ended) < len(kids)) or not ended:
        return WaitingFor.children(mode, group)
    result: dict[str, Any] = {"children": [_report(r) for r in ended]}
    if mode == "any":
        result["still_running"] = [r.id for r in kids if r.status not in TERMINAL]
    spent = (sum(r.input_tokens for r in ended), sum(r.output_tokens for r in ended),
             sum(r.cost_micros for r in ended))
    return Collected(result, spent)


def _report(run: RunRecord) -> dict[str, Any]:
    """What the model reads of one ended child: its result, or why it failed."""
    out: dict[str, Any] = {"run_id": run.id, "agent": run.agent_name, "status": run.status}
    if run.status == "succeeded":
        out["result"] = run.result
    elif run.status == "cancelled":
        out["reason"] = reduced(run.cancel_reason or "cancelled", 500)
    else:
        out["error"] = {"code": run.error_code,
                        "message": reduced(run.error_message or "failed", 500)}
    return out


def charge(ledger: BudgetLedger, spent: list[tuple[int, int, int]]) -> BudgetLedger:
    """The parent's ledger with its children's spend added (committed with the
    lap that collected them, so it is charged exactly once)."""
    if not spent:
        return ledger
    return ledger.model_copy(update={
        "input_tokens": ledger.input_tokens + sum(s[0] for s in spent),
        "output_tokens": ledger.output_tokens + sum(s[1] for s in spent),
        "cost": ledger.cost + Decimal(sum(s[2] for s in spent)) / 1_000_000})


def wake_parent(rt: Runtime, run: RunRecord) -> None:
    """After ``run`` ended: if that woke its parent (the end's transaction did,
    ``store.children.notify_parent``), send the parent's lap now rather than
    leave it to the sweeper's hand-off re-send. A duplicate is harmless."""
    if run.parent_run_id is None or run.forked_from_lap is not None:
        return
    parent = rt.store.get_run(run.parent_run_id)
    if parent is not None and parent.status == "queued" and parent.lease_owner is None:
        rt.send_all([DueLap(parent.id, parent.next_lap, parent.agent_name,
                            parent.agent_version)])


def cancel_all(rt: Runtime, run: RunRecord) -> int:
    """The parent is ending (cancelled or failed): cancel its unended children,
    each of which then undoes its own effects. Idempotent: the ending lap may
    run it again after a crash."""
    reason = (f"parent run {run.id} is ending: "
              f"{run.cancel_reason or run.error_message or run.ending or 'ended'}")
    due = rt.store.cancel_children(run.id, reason=reduced(reason, 1000),
                                   by=run.cancelled_by or "agent-worker", now=rt.clock.now())
    rt.send_all(due)
    return len(due)


__all__ = ["MARKER", "Collected", "begin", "budget_share", "cancel_all", "charge", "child_id",
           "is_marker", "outcome", "wake_parent"]
