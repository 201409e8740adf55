"""Compensation: when a run fails or is cancelled, settle the compensatable
effects whose outcome is unknown, then undo the applied ones in reverse order.
Each undo is itself a ledger entry (key ``<original>:undo``), so a worker
killed mid-compensation resumes where it stopped and never undoes anything
twice (undo functions receive that key and must pass it on, like any
idempotent call)."""

from __future__ import annotations

from agent_worker.agent import Agent
from agent_worker.constants import compensation_key
from agent_worker.engine import admit
from agent_worker.errors import CompensationError
from agent_worker.faults import fault
from agent_worker.runtime import Runtime
from agent_worker.store.base import EffectIntent, EffectRecord
from agent_worker.tools import ToolContext


def reconcile(rt: Runtime, agent: Agent, run_id: str) -> str | None:
    """Settle the compensatable effects whose outcome is not known (pending:
    a worker died mid-call; unknown: still waiting for a human) before undoing
    anything, the way a replay would: the tool's lookup first (found means it
    landed, so it is undone; not found means it never did); without a lookup,
    a human decides. Returns the key of the first effect a human must resolve,
    or ``None`` when every outcome is known."""
    for effect in rt.store.list_effects(run_id):
        if (effect.kind != "compensatable" or effect.compensates is not None
                or effect.status not in ("pending", "unknown")):
            continue
        tool = agent.tool(effect.tool_name)
        if tool is None or tool.lookup_fn is None:
            if effect.status == "pending":
                rt.store.finish_effect(
                    effect.key, status="unknown", result=None, now=rt.clock.now(),
                    error="the run is ending and this call's outcome is unknown (no lookup); "
                          "a human must say whether it landed before it can be undone")
            return effect.key
        found = tool.lookup_fn(effect.key)
        if found is None:
            rt.store.finish_effect(effect.key, status="not_applied", result=None,
                                   error="lookup found nothing: never applied",
                                   now=rt.clock.now())
        else:
            rt.store.finish_effect(effect.key, status="applied", result=found, error=None,
                                   now=rt.clock.now())
    return None


def compensate(rt: Runtime, agent: Agent, run_id: str, tenant: str | None,
               owner: str) -> int:
    """Run every outstanding compensation of ``run_id``; returns how many ran."""
    effects = rt.store.list_effects(run_id)
    todo: list[EffectRecord] = sorted(
        (e for e in effects
         if e.kind == "compensatable" and e.compensates is None
         and e.status == "applied"),
        key=lambda e: (e.lap, e.call_index), reverse=True)
    for effect in todo:
        tool = agent.tool(effect.tool_name)
        if tool is None or tool.compensate_fn is None:
            raise CompensationError(
                f"effect {effect.key}: tool {effect.tool_name} has no compensation here")
        key = compensation_key(effect.key)
        undo, _ = rt.store.begin_effect(
            EffectIntent(key=key, run_id=run_id, lap=effect.lap, call_index=effect.call_index,
                         tool_name=f"{tool.name}:undo", tool_version=tool.version,
                         kind="idempotent", args_hash=effect.args_hash, args=effect.args,
                         compensates=effect.key),
            owner=owner, now=rt.clock.now(), fence_cancel=False)
        if undo.status != "applied":
            fault("in_compensation", scope=tool.name)
            ctx = ToolContext(run_id=run_id, lap=effect.lap, call_index=effect.call_index,
                              idempotency_key=key, tenant=tenant)
            # Untrusted like any tool output (engine.admit): cleaned, redacted, bounded.
            result = admit.tool_result(tool.compensate_fn(effect.args, effect.result, ctx),
                                       rt.settings, agent.redact)
            now = rt.clock.now()
            rt.store.finish_effect(key, status="applied", result=result, error=None, now=now)
        rt.store.finish_effect(effect.key, status="compensated", result=None, error=None,
                               now=rt.clock.now())
    return len(todo)
