"""One lap of one run (DESIGN.md, "The lap protocol"). Shared by the Celery
task and the in-process runner; idempotent under redelivery.

    claim ─ load ─ model step (journaled) ─ tool steps (ledger) ─ fenced commit ─ send next

Anything that stops a lap early goes through ``release`` (``engine.release``):
a retry with backoff, a pause, or a failure that will run compensations.
Nothing here commits twice or enqueues before its commit.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agent_worker import fairshare, tracing
from agent_worker.agent import Agent
from agent_worker.core.budget import Budget
from agent_worker.core.checkpoint import Checkpoint, PendingCall, dump_checkpoint, load_checkpoint
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION, model_key
from agent_worker.core.errors import (
    BudgetExceededError,
    LapFailedError,
    LeaseLost,
    NestingTooDeepError,
    RunCancelled,
)
from agent_worker.core.faults import fault
from agent_worker.core.logs import bind, lap_context
from agent_worker.core.messages import Message, Usage
from agent_worker.core.runstate import StateDraft, apply_edit
from agent_worker.core.untrusted import clean
from agent_worker.core.vocabulary import ENDED_BY_LAP, RUNNABLE, WaitingFor
from agent_worker.engine import admit, children, parallel
from agent_worker.engine.calls import CallRunner, Pause
from agent_worker.engine.compaction import summary_end, summary_message
from agent_worker.engine.heartbeat import Heartbeat
from agent_worker.engine.release import (
    Outcome,
    finish_ending,
    handle_error,
    release,
    resend_orphan,
)
from agent_worker.engine.window import build_request
from agent_worker.runtime import Runtime
from agent_worker.store.base import Claim, DueLap, LapCommit, RunUpdate

log = logging.getLogger("agent_worker.lap")
_HOST = socket.gethostname()


def new_owner() -> str:
    """A lease owner unique to this lap attempt."""
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run_lap(rt: Runtime, run_id: str, lap: int) -> Outcome:
    """Run lap ``lap`` of ``run_id`` if this delivery may; see module docstring.
    Every log record inside carries the lap's identity (``agent_worker.core.logs``)."""
    with rt.active_laps.held(), lap_context(run_id, lap), \
            tracing.lap_trace(rt, run_id, lap) as trace:
        outcome = _run_lap(rt, run_id, lap)
        trace.end(outcome)
        return outcome


def _run_lap(rt: Runtime, run_id: str, lap: int) -> Outcome:
    owner = new_owner()
    claim = rt.store.claim(run_id, lap, owner=owner, now=rt.clock.now(),
                           lease_seconds=rt.settings.lease_ttl_seconds,
                           window_messages=_window_size(rt), served=_served(rt))
    if claim is None:
        return _not_claimed(rt, run_id, lap)
    tracing.current().claimed(claim.run)
    fault("after_claim")
    run = claim.run
    bind(agent=f"{run.agent_name}@{run.agent_version}", tenant=run.tenant,
         attempt=run.lap_attempts)
    agent = rt.registry.resolve(run.agent_name, run.agent_version)
    if agent is None:
        # Reachable only if the registry changed after the claim (the claim is
        # fenced on served versions): leave it queued, marked sent now, so the
        # sweeper re-sends it to its version's queue once the hand-off lapses.
        rt.store.release(run_id, lap, owner=owner, now=rt.clock.now(),
                         outcome=RunUpdate(status="queued", enqueue=True),
                         event={"kind": "unserved", "worker_serves": _served(rt)},
                         reset_attempts=True)
        return "unserved"
    with Heartbeat(rt, run_id, lap, owner) as hb:
        try:
            if run.ending is not None or run.cancel_requested_at is not None:
                with rt.active_laps.waiting():  # compensations call tools
                    return finish_ending(rt, agent, claim)
            if run.lap_attempts > rt.settings.max_lap_attempts:
                raise LapFailedError(
                    f"lap {lap} was attempted {run.lap_attempts - 1} times without committing "
                    "(its worker died or it kept failing)")
            return _Lap(rt, agent, claim, hb).run()
        except LeaseLost:
            log.info("run %s lap %s: lease lost; another worker owns it", run_id, lap)
            resend_orphan(rt, claim)
            return "lost"
        except RunCancelled:
            release(rt, claim, RunUpdate(status="queued", enqueue=True),
                     {"kind": "cancel_seen"}, fence_cancel=False)
            return "retrying"
        except Exception as e:
            return handle_error(rt, claim, e, agent.redact)


def _served(rt: Runtime) -> list[str]:
    return [f"{name}@{version}" for name, version in rt.registry.served_versions()]


def _not_claimed(rt: Runtime, run_id: str, lap: int) -> Outcome:
    """A stale or duplicate delivery, or a run pinned to a version this worker
    does not serve (the claim is fenced on served versions, so old code never
    runs a migrated run): the latter is recorded, and left queued for the
    sweeper to re-send to its version's queue."""
    run = rt.store.get_run(run_id)
    if (run is None or run.next_lap != lap or run.status not in RUNNABLE
            or rt.registry.resolve(run.agent_name, run.agent_version) is not None):
        return "skipped"
    rt.store.record_event(run_id, lap, "unserved", {"worker_serves": _served(rt)},
                          now=rt.clock.now())
    return "unserved"


def _window_size(rt: Runtime) -> int:
    return max((a.window_messages for a in rt.registry.all()), default=40)


@dataclass
class _Lap:
    rt: Runtime
    agent: Agent
    claim: Claim
    hb: Heartbeat
    started: float = field(default_factory=time.perf_counter)
    trace: list[dict[str, Any]] = field(default_factory=list)

    def _mark(self, step: str, **data: Any) -> None:
        """A step of the lap's trace (the ``lap_committed`` event's), without
        the flags that are off: every lap stores one, and readers ``.get`` them."""
        self.trace.append({"step": step, "ms": round((time.perf_counter() - self.started) * 1e3,
                                                     2),
                           **{k: v for k, v in data.items() if v is not False and v is not None}})

    def run(self) -> Outcome:
        claim, agent = self.claim, self.agent
        ckpt = load_checkpoint(claim.checkpoint)
        if ckpt.agent_version != agent.version:
            ckpt = self._migrate(ckpt)
        usage: Usage | None = None
        cost = Decimal(0)
        assistant: Message | None = None
        seq = ckpt.message_count
        if ckpt.pending_calls:
            calls = list(ckpt.pending_calls)
        else:
            limits = Budget.of_run(claim.run.limits)
            reason = ckpt.budget.exceeded(limits, self.rt.clock.now())
            if reason is not None:
                return self._over_budget(reason, limits)
            assistant = self._model_step(ckpt)
            seq += 1
            usage = Usage.model_validate((assistant.meta or {}).get("usage", {}))
            cost = agent.price_table.cost((assistant.meta or {}).get("model", ""), usage)
            calls = [PendingCall(call=c, lap=claim.lap, index=i)
                     for i, c in enumerate(assistant.tool_calls)]
        draft = StateDraft.of(ckpt, self.rt.settings)
        runner = CallRunner(self.rt, agent, claim, self.hb, draft)
        results: list[Message] = []
        signals: list[int] = []
        pause: Pause | None = None
        remaining: list[PendingCall] = []
        # In the model's order, concurrently where allowed (engine.parallel),
        # each call in its own span (engine.parallel._timed).
        limit = agent.max_parallel_calls or self.rt.settings.max_parallel_calls
        # Tools wait on the world: the lap's place goes to another lap meanwhile.
        with self.rt.active_laps.waiting() if calls else nullcontext():
            for i, (pc, outcome, took) in enumerate(parallel.outcomes(
                    runner, calls, limit=limit, check=self.hb.check)):
                if isinstance(outcome, Pause):
                    pause, remaining = outcome, [outcome.call, *calls[i + 1:]]
                    break
                results.append(outcome.message)
                if outcome.signal_id is not None:
                    signals.append(outcome.signal_id)
                self._mark("tool", name=pc.call.name, error=outcome.message.is_error,
                           call_ms=took)
        if pause is not None and pause.waiting_for and pause.waiting_for.kind == "effect":
            return self._hold_for_effect(pause)
        edits: list[int] = []
        if not remaining:
            # Never between a call and the results of its siblings: a note
            # there would split the assistant's tool calls from their results.
            edits = self._apply_edits(draft, results)
        ledger = ckpt.budget.charge(usage, cost) if usage is not None else ckpt.budget
        ledger = children.charge(ledger, runner.children_spent)
        summary = self._compaction(ckpt, seq + len(results))
        summary_seq = ckpt.summary_seq
        if summary is not None:
            summary_seq = seq + len(results)
            results.append(summary)
        new_messages = [(seq + i, m) for i, m in enumerate(results)]
        if assistant is not None:
            # The journal was committed without waiting for fsync; writing it
            # again here (a no-op when it survived) makes the durable lap
            # commit carry it, so a database crash cannot leave a gap.
            new_messages.insert(0, (ckpt.message_count, assistant))
        next_ckpt = draft.apply_to(ckpt).model_copy(update={
            "lap": claim.lap, "budget": ledger, "pending_calls": tuple(remaining),
            "message_count": seq + len(results), "agent_version": agent.version,
            "summary_seq": summary_seq, "schema_version": CHECKPOINT_SCHEMA_VERSION})
        update = self._next_status(assistant, calls, pause)
        self._mark("commit")
        with tracing.current().step("commit", **{"agent_worker.status": update.status}):
            committed = self.rt.store.commit_lap(LapCommit(
            run_id=claim.run.id, lap=claim.lap, owner=claim.owner, messages=new_messages,
            checkpoint=dump_checkpoint(next_ckpt), schema_version=CHECKPOINT_SCHEMA_VERSION,
            update=update,
            usage=(ledger.laps, ledger.input_tokens, ledger.output_tokens,
                   int(ledger.cost * 1_000_000)),
            # The lap's calls and results are its messages (a stream sends
            # them with this event): not counted again here.
            event={"trace": self.trace, "attempt": claim.run.lap_attempts,
                   **({"paused": pause.status} if pause else {})},
            new_approvals=[pause.approval] if pause and pause.approval else (),
            delivered_signals=signals, now=self.rt.clock.now(), agent_version=agent.version,
            applied_edits=edits,
            # A lap that only read may be lost to a database crash and run
            # again (LapCommit.durable); one that acted on the world, paused,
            # took a signal or an edit, or migrated its checkpoint is on disk
            # before its next lap is sent.
            durable=(runner.acted or pause is not None or bool(signals) or bool(edits)
                     or claim.run.agent_version != agent.version)))
        if not committed:
            return self._fence_failed()
        fault("after_commit")
        fairshare.used(self.rt, claim.run, claim.lap, agent.provider_key, usage)
        if update.enqueue:
            # The commit pinned the run to this agent's version (a migration moves it).
            self.rt.send_all([DueLap(claim.run.id, claim.lap + 1, claim.run.agent_name,
                                     agent.version)])
        elif update.status == "waiting":
            # The commit found what it waits for already there and queued the
            # run instead (store.wakeups): send it like any queued run.
            resend_orphan(self.rt, self.claim)
        if not update.enqueue:
            self.rt.send_all([])  # the run gave its slot back: admission hands it on
        if update.status in ENDED_BY_LAP:
            children.wake_parent(self.rt, claim.run)
            return "finished"
        return "paused" if pause else "committed"

    def _apply_edits(self, draft: StateDraft, results: list[Message]) -> list[int]:
        """Operators' state edits loaded by the claim (``update_state``): applied
        to this lap's checkpoint and marked applied by its fenced commit, so
        each lands exactly once, at a lap boundary. A note becomes a message
        from the operator, which the model reads in the next lap."""
        for edit in self.claim.state_edits:
            apply_edit(draft, edit.edit)
            if edit.edit.get("note"):
                results.append(Message(role="user", content=(
                    f"[Note from operator {edit.requested_by}]: {edit.edit['note']}"),
                    meta={"operator_note": edit.id}))
        return [e.id for e in self.claim.state_edits]

    def _model_step(self, ckpt: Checkpoint) -> Message:
        """Journaled model output: reused on replay, so tool calls and their keys
        are the same on every attempt of this lap."""
        claim = self.claim
        for stored in claim.lap_messages:
            if stored.seq == ckpt.message_count and stored.message.role == "assistant":
                self._mark("model", replayed=True)
                return stored.message
        key = model_key(claim.run.id, claim.lap)
        request = build_request(self.agent, claim.run.id, claim.lap, ckpt, claim.window, key)
        # Admitted before journaling: a replay reads back exactly what this
        # attempt acts on (tool arguments, hence effect keys' argument hashes).
        with tracing.current().step("chat", **{"gen_ai.operation.name": "chat"}) as span:
            with self.rt.active_laps.waiting():
                reply = self.agent.client().complete(request)
            response = admit.model_output(reply, self.rt.settings)
            span.model_response(response)
        # No idempotency key here: it is the row's run and lap (model_key).
        meta = {"usage": response.usage.model_dump(), "model": response.model}
        if response.stop_reason is not None:
            meta["stop_reason"] = response.stop_reason
        message = response.message.model_copy(update={"meta": meta})
        journaled = self.rt.store.journal_model_output(
            claim.run.id, claim.lap, owner=claim.owner, seq=ckpt.message_count,
            message=message, now=self.rt.clock.now())
        self._mark("model")
        fault("after_model_journal")
        return journaled

    def _compaction(self, ckpt: Checkpoint, count: int) -> Message | None:
        """A new cumulative summary, when enough messages left the window."""
        every = self.agent.compact_after
        if not every:
            return None
        previous = next((m.message for m in self.claim.window if m.seq == ckpt.summary_seq),
                        None)
        covered = summary_end(previous) if previous is not None else 0
        end = count - self.agent.window_messages
        if end - covered < every:
            return None
        older = [m.message for m in self.rt.store.list_messages(
            self.claim.run.id, start=covered, end=end) if not (m.message.meta or {}).get(
                "summary_of")]
        before = previous.content.split("\n", 1)[-1] if previous is not None else None
        self._mark("compaction", covered=[covered, end])
        with self.rt.active_laps.waiting():
            summary = self.agent.summarize(before, older)
        return summary_message(summary, end)

    def _next_status(self, assistant: Message | None, calls: list[PendingCall],
                     pause: Pause | None) -> RunUpdate:
        if pause is not None:
            return RunUpdate(status=pause.status, wake_at=pause.wake_at,
                             waiting_for=pause.waiting_for)
        if assistant is not None and not calls:
            return RunUpdate(status="succeeded", result=_final_result(
                assistant.content, self.rt.settings.max_json_depth))
        return RunUpdate(status="queued", enqueue=True)

    def _hold_for_effect(self, pause: Pause) -> Outcome:
        """Stop without committing: a human must say whether the effect landed."""
        release(self.rt, self.claim, RunUpdate(
            status="waiting", waiting_for=pause.waiting_for, error_code="effect_unknown",
            error_message=f"{pause.waiting_for}: outcome unknown; resolve it with "
                          "`agent-worker effects resolve`"),
            {"kind": "effect_unknown", "key": pause.waiting_for.ref if pause.waiting_for else ""},
            reset_attempts=True)
        return "paused"

    def _over_budget(self, reason: str, limits: Budget) -> Outcome:
        if limits.on_exceed == "pause":
            release(self.rt, self.claim, RunUpdate(
                status="waiting", waiting_for=WaitingFor("budget"), error_code="budget_exceeded",
                error_message=reason), {"kind": "budget_pause", "reason": reason},
                reset_attempts=True)
            return "paused"
        raise BudgetExceededError(reason)

    def _fence_failed(self) -> Outcome:
        """The commit found someone else's lease (or a cancel)."""
        run = resend_orphan(self.rt, self.claim)
        if (run is not None and run.cancel_requested_at is not None
                and run.lease_owner == self.claim.owner):
            raise RunCancelled(f"run {run.id} was cancelled during lap {self.claim.lap}")
        return "lost"

    def _migrate(self, ckpt: Checkpoint) -> Checkpoint:
        if self.agent.migrate is None:
            return ckpt
        return self.agent.migrate(ckpt, ckpt.agent_version)


def _final_result(text: str, max_depth: int) -> Any:
    """The final answer: parsed if the model answered in JSON, else the text.
    Parsing can bring back what the text only spelled (``"\\u0000"``), so the
    parsed value is cleaned too; one nested too deep stays text."""
    try:
        value: Any = json.loads(text)
        return clean(value, max_depth=max_depth, what="result")
    except (TypeError, ValueError, RecursionError, NestingTooDeepError):
        return text


__all__ = ["Outcome", "run_lap"]
