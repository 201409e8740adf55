"""Records shaped for operators: the dicts ``--json`` prints and the tables
render. Kept free of I/O so the shapes are easy to read and test."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agent_worker.core.vocabulary import TERMINAL

if TYPE_CHECKING:  # annotations only: the store package loads SQLAlchemy
    from agent_worker.store.base import (
        ApprovalRecord,
        EffectRecord,
        EventRecord,
        RunRecord,
        StoredMessage,
    )

TEXT_LIMIT = 300


def clip(text: str | None, limit: int = TEXT_LIMIT) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plan_progress(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """Done/total of the plan the agent declared in its checkpoint, if any."""
    plan = (state or {}).get("plan") or []
    if not plan:
        return None
    done = sum(1 for item in plan if isinstance(item, dict) and item.get("done"))
    upcoming = next((item.get("title") for item in plan
                     if isinstance(item, dict) and not item.get("done")), None)
    return {"done": done, "total": len(plan), "next": upcoming}


def is_stale(run: RunRecord, at: datetime, stale_after: float) -> bool:
    """Should be moving but has not checkpointed for ``stale_after`` seconds
    (the definition of ``list_runs(stale=True)`` and the metrics)."""
    return (run.status in ("queued", "running") and run.last_checkpoint_at is not None
            and (at - run.last_checkpoint_at).total_seconds() > stale_after)


def run_summary(run: RunRecord, state: dict[str, Any] | None, at: datetime,
                stale_after: float) -> dict[str, Any]:
    """One row of ``runs list``."""
    # lazy: the store package loads SQLAlchemy, which --help must not pay for
    from agent_worker.store.admitting import THROTTLED

    since = (at - run.last_checkpoint_at).total_seconds() if run.last_checkpoint_at else None
    return {
        "id": run.id, "agent": run.agent_name, "agent_version": run.agent_version,
        "tenant": run.tenant, "status": run.status, "lap": run.lap, "next_lap": run.next_lap,
        "lap_attempts": run.lap_attempts, "waiting_for": run.waiting_for,
        "wake_at": run.wake_at, "stale": is_stale(run, at, stale_after),
        "last_checkpoint_at": run.last_checkpoint_at,
        "since_checkpoint_seconds": None if since is None else round(since, 3),
        "created_at": run.created_at, "updated_at": run.updated_at,
        "finished_at": run.finished_at, "cost": str(Decimal(run.cost_micros) / 1_000_000),
        "cost_micros": run.cost_micros, "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens, "recoveries": run.recoveries,
        "error_code": run.error_code, "error_message": run.error_message,
        "cancel_requested": run.cancel_requested_at is not None,
        "parent_run_id": run.parent_run_id, "forked_from_lap": run.forked_from_lap,
        "plan": plan_progress(state),
        # fair share (agent_worker.fairshare): queued with no message, waiting for a slot
        "priority": run.priority,
        "throttled": run.status == "queued" and run.admitted_lap == THROTTLED,
    }


def approval_view(a: ApprovalRecord, at: datetime) -> dict[str, Any]:
    return {
        "id": a.id, "run_id": a.run_id, "effect_key": a.effect_key, "tool": a.tool_name,
        "arguments": a.arguments, "reason": a.reason, "owner": a.owner, "status": a.status,
        "on_timeout": a.on_timeout, "escalate_to": a.escalate_to,
        "requested_at": a.requested_at, "age_seconds": round((at - a.requested_at)
                                                             .total_seconds(), 3),
        "timeout_at": a.timeout_at, "decided_by": a.decided_by, "comment": a.comment,
        "decided_at": a.decided_at, "approved_arguments": a.approved_arguments,
    }


def budget_view(run: RunRecord, state: dict[str, Any] | None) -> dict[str, Any]:
    """What the run spent against each limit."""
    limits = run.limits or {}
    ledger = (state or {}).get("budget") or {}
    return {
        "laps": {"used": run.laps_used, "limit": limits.get("max_laps")},
        "input_tokens": {"used": run.input_tokens, "limit": limits.get("max_input_tokens")},
        "output_tokens": {"used": run.output_tokens, "limit": limits.get("max_output_tokens")},
        "cost": {"used": str(Decimal(run.cost_micros) / 1_000_000),
                 "limit": limits.get("max_cost")},
        "deadline": ledger.get("deadline"), "on_exceed": limits.get("on_exceed", "fail"),
    }


def run_detail(run: RunRecord, state: dict[str, Any] | None,
               approvals: Sequence[ApprovalRecord], at: datetime,
               stale_after: float) -> dict[str, Any]:
    """Everything ``runs show`` prints."""
    detail = run_summary(run, state, at, stale_after)
    detail.update({
        "input": run.input, "result": run.result, "error_detail": run.error_detail,
        "budget": budget_view(run, state),
        "lease": None if run.lease_owner is None else {
            "owner": run.lease_owner, "expires_at": run.lease_expires_at,
            "expires_in_seconds": None if run.lease_expires_at is None else round(
                (run.lease_expires_at - at).total_seconds(), 3)},
        "cancel": None if run.cancel_requested_at is None else {
            "requested_at": run.cancel_requested_at, "reason": run.cancel_reason,
            "by": run.cancelled_by},
        "ending": run.ending, "labels": run.labels or {},
        "checkpoint": None if state is None else {
            "lap": state.get("lap"), "schema_version": state.get("schema_version"),
            "agent_version": state.get("agent_version"),
            "plan": state.get("plan") or [], "next_action": state.get("next_action"),
            "facts": state.get("facts") or {}, "message_count": state.get("message_count"),
            "pending_calls": [
                {"tool": p.get("call", {}).get("name"), "lap": p.get("lap"),
                 "index": p.get("index"), "wake_at": p.get("wake_at")}
                for p in state.get("pending_calls") or []]},
        "pending_approvals": [approval_view(a, at) for a in approvals if a.status == "pending"],
        "finished": run.status in TERMINAL,
    })
    return detail


def effect_view(e: EffectRecord) -> dict[str, Any]:
    return {"key": e.key, "run_id": e.run_id, "lap": e.lap, "call_index": e.call_index,
            "tool": e.tool_name, "kind": e.kind, "status": e.status, "attempts": e.attempts,
            "error": e.error, "args": e.args, "created_at": e.created_at,
            "updated_at": e.updated_at}


class LapBook:
    """Turns events, messages and ledger rows into one record per committed lap.

    Fed incrementally (``runs tail``) or all at once (``runs show --laps``), in
    message order. A call is known by (lap, call index), as its effect key is:
    providers reuse call ids across turns (the scripted model says ``call_0``
    on every lap), so an id alone would pin every result on the latest lap.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.messages: dict[int, list[StoredMessage]] = {}
        # Calls asked for and not yet answered, per provider id, oldest first: a
        # result answers the oldest open call with its id (a paused call's result
        # may come laps later, after other turns reused the id).
        self.open_calls: dict[str, deque[tuple[int, int]]] = {}
        self.answers: dict[int, tuple[int, int]] = {}  # tool message seq -> (lap, index)
        self.effects: dict[str, EffectRecord] = {}

    def add_messages(self, messages: Iterable[StoredMessage]) -> None:
        for m in messages:
            self.messages.setdefault(m.lap, []).append(m)
            for i, call in enumerate(m.message.tool_calls):
                self.open_calls.setdefault(call.id, deque()).append((m.lap, i))
            waiting = self.open_calls.get(m.message.tool_call_id or "")
            if m.message.role == "tool" and waiting:
                self.answers[m.seq] = waiting.popleft()

    def add_effects(self, effects: Iterable[EffectRecord]) -> None:
        self.effects.update({e.key: e for e in effects})

    def lap(self, event: EventRecord) -> dict[str, Any]:
        """The record of the lap ``event`` (a ``lap_committed``) committed."""
        data = event.data or {}
        trace: list[dict[str, Any]] = list(data.get("trace") or [])
        lap = event.lap or 0
        msgs = self.messages.get(lap, [])
        assistant = next((m.message for m in msgs if m.message.role == "assistant"), None)
        model_mark = next((t for t in trace if t.get("step") == "model"), None)
        tool_marks = [t for t in trace if t.get("step") == "tool"]
        previous = float(model_mark["ms"]) if model_mark else 0.0
        tools = []
        for i, stored in enumerate(x for x in msgs if x.message.role == "tool"):
            m = stored.message
            mark = tool_marks[i] if i < len(tool_marks) else None
            ms = None
            if mark is not None:
                # A call's own time when the lap recorded it (calls of one
                # turn may overlap); else the time since the previous mark.
                ms = mark.get("call_ms", round(float(mark["ms"]) - previous, 2))
                previous = float(mark["ms"])
            origin = self.answers.get(stored.seq)
            effect = (self.effects.get(f"{self.run_id}:{origin[0]}:{origin[1]}")
                      if origin else None)
            tools.append({
                "name": m.name, "call_id": m.tool_call_id,
                "call_lap": origin[0] if origin else None,
                "call_index": origin[1] if origin else None, "error": m.is_error,
                "result": clip(m.content, 200), "ms": ms,
                "effect": None if effect is None else {
                    "key": effect.key, "kind": effect.kind, "status": effect.status},
            })
        meta = (assistant.meta or {}) if assistant else {}
        return {
            "lap": lap, "committed_at": event.created_at, "attempt": data.get("attempt"),
            "duration_ms": trace[-1].get("ms") if trace else None,
            "paused": data.get("paused"),
            "model": None if assistant is None else {
                "text": clip(assistant.content),
                "tool_calls": [{"name": c.name, "arguments": c.arguments}
                               for c in assistant.tool_calls],
                "replayed": bool(model_mark and model_mark.get("replayed")),
                "ms": model_mark.get("ms") if model_mark else None,
                "model": meta.get("model"), "usage": meta.get("usage"),
                "stop_reason": meta.get("stop_reason")},
            "tools": tools,
            "trace": trace,
        }


__all__ = ["LapBook", "approval_view", "budget_view", "clip", "effect_view", "is_stale",
           "plan_progress", "run_detail", "run_summary"]
