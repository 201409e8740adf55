"""Ending a run: first settle every effect whose outcome is not known, then
undo the applied compensatable ones in reverse order (the saga).

Settling (``reconcile``) follows the ledger's replay rules, minus the re-call:
a ``pending`` or ``unknown`` effect of any kind is looked up by its key when
its tool has a lookup, and the ledger adopts the answer (``applied`` with the
vendor's record, or ``not_applied``); without a lookup it is ``unknown`` and a
human says whether it landed (``effects resolve``) before the run can end. An
ending run never calls a tool again, even an idempotent one: that would make
the call the run was stopped from making. So a final run's ledger holds no
``pending`` row (docs/reference/guarantees.md).

Each undo is itself a ledger entry (key ``<original>:undo``), so a worker
killed mid-compensation resumes where it stopped and never undoes anything
twice (undo functions receive that key and must pass it on, like any
idempotent call). Every decision is preceded by a fenced write (the intent's
``begin_effect``, as a replay's): a worker that lost the run decides nothing,
and one killed midway leaves rows the next attempt settles the same way."""

from __future__ import annotations

from agent_worker.agent import Agent
from agent_worker.core.constants import compensation_key
from agent_worker.core.errors import CompensationError
from agent_worker.core.faults import fault
from agent_worker.core.vocabulary import EffectStatus
from agent_worker.engine import admit
from agent_worker.runtime import Runtime
from agent_worker.store.base import EffectIntent, EffectRecord
from agent_worker.tools import ToolContext

#: What an ending run's ledger may not be left with.
UNSETTLED: tuple[EffectStatus, ...] = ("pending", "unknown")


def _held(rt: Runtime, effect: EffectRecord, owner: str) -> EffectRecord:
    """``effect`` as it stands now, after re-checking that ``owner`` still
    holds the run (raises ``LeaseLost``); a pending row counts the attempt,
    like a replay's."""
    row, _ = rt.store.begin_effect(
        EffectIntent(key=effect.key, run_id=effect.run_id, lap=effect.lap,
                     call_index=effect.call_index, tool_name=effect.tool_name,
                     tool_version=effect.tool_version, kind=effect.kind,
                     args_hash=effect.args_hash, args=effect.args,
                     compensates=effect.compensates),
        owner=owner, now=rt.clock.now(), fence_cancel=False)
    return row


def reconcile(rt: Runtime, agent: Agent, run_id: str, owner: str) -> dict[str, EffectStatus]:
    """Settle every effect of the ending run ``run_id`` whose outcome is not
    known (pending: a worker died mid-call, or its reply was lost; unknown:
    still waiting for a human), whatever its tool's kind, before anything is
    undone: the tool's lookup first (found: ``applied``, with what the vendor
    recorded; not found: ``not_applied``); without a lookup (or without the
    tool, removed by a deploy), ``unknown``, for a human. Compensations
    (``:undo`` rows) are left to ``compensate``, which finishes them under
    their own key.

    Returns each examined effect's status now, in ledger order; the run may
    end only when none is ``unknown``."""
    settled: dict[str, EffectStatus] = {}
    for effect in rt.store.list_effects(run_id):
        if effect.compensates is not None or effect.status not in UNSETTLED:
            continue
        row = _held(rt, effect, owner)
        if row.status not in UNSETTLED:
            settled[row.key] = row.status
            continue
        tool = agent.tool(row.tool_name)
        if tool is None or tool.lookup_fn is None:
            if row.status == "pending":
                why = ("its tool is no longer deployed" if tool is None
                       else "its tool has no lookup")
                rt.store.finish_effect(
                    row.key, status="unknown", result=None, now=rt.clock.now(),
                    error=f"the run is ending and this call's outcome is unknown ({why}; "
                          "an ending run never calls a tool again): a human must say "
                          "whether it landed")
            settled[row.key] = "unknown"
            continue
        found = tool.lookup_fn(row.key)
        if found is None:
            rt.store.finish_effect(row.key, status="not_applied", result=None,
                                   error="lookup found nothing: never applied",
                                   now=rt.clock.now())
            settled[row.key] = "not_applied"
        else:
            # Untrusted like any tool output (engine.admit): cleaned, redacted, bounded.
            kept = admit.tool_result(found, rt.settings, agent.redact)
            rt.store.finish_effect(row.key, status="applied", result=kept, error=None,
                                   now=rt.clock.now())
            settled[row.key] = "applied"
    return settled


def give_up(rt: Runtime, run_id: str, owner: str) -> list[str]:
    """The ending failed for good: mark every effect still ``pending``
    (including an undo that never finished) ``unknown``, so the final ledger
    says what is true; returns the keys of every ``unknown`` effect of the run,
    for its record. No lookup is asked: it may be what kept failing."""
    unknown: list[str] = []
    for effect in rt.store.list_effects(run_id):
        if effect.status == "pending":
            row = _held(rt, effect, owner)
            if row.status == "pending":
                rt.store.finish_effect(
                    row.key, status="unknown", result=None, now=rt.clock.now(),
                    error="the run's ending failed for good while this call's outcome was "
                          "unknown: check it with the vendor")
                unknown.append(row.key)
            elif row.status == "unknown":
                unknown.append(row.key)
        elif effect.status == "unknown":
            unknown.append(effect.key)
    return unknown


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
