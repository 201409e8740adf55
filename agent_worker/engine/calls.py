"""One tool call of a lap, made replay-safe by the effect ledger (DESIGN.md,
lap protocol step 4). Reads run directly; everything else writes its intent
before acting and its outcome after, so a replayed lap decides from the ledger
what already happened instead of guessing.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from pydantic import BaseModel, ValidationError

from agent_worker.agent import Agent
from agent_worker.children import StartChildren
from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.constants import effect_key
from agent_worker.core.errors import (
    EffectTimeoutError,
    IdempotencyConflictError,
    InvalidInputError,
    ToolError,
    ToolTimeoutError,
)
from agent_worker.core.faults import fault
from agent_worker.core.runstate import StateDraft
from agent_worker.core.vocabulary import EffectStatus, WaitingFor
from agent_worker.engine import admit, children, policy
from agent_worker.engine.callresult import Done, Pause, decision, result, with_decision
from agent_worker.engine.controls import sleep, wait_for_signal, write_state
from agent_worker.engine.heartbeat import Heartbeat
from agent_worker.engine.progress import CallBeat
from agent_worker.runtime import Runtime
from agent_worker.store.base import ApprovalRecord, Claim, EffectIntent, EffectRecord
from agent_worker.tools import Tool, ToolContext


def args_hash(tool_name: str, arguments: dict[str, Any]) -> str:
    """Hash of what is being asked, to refuse a key reused for something else."""
    canonical = json.dumps([tool_name, arguments], sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class CallRunner:
    """Runs the calls of one lap attempt for one claimed run."""

    def __init__(self, rt: Runtime, agent: Agent, claim: Claim,
                 hb: Heartbeat | None = None, state: StateDraft | None = None) -> None:
        self.rt, self.agent, self.claim = rt, agent, claim
        #: The run state this lap's calls write (``agent_worker.core.runstate``).
        self.state = state
        self.run_id = claim.run.id
        # The lap's lease: tools heartbeat through it (ctx.heartbeat), retries
        # check it before each new attempt.
        self.hb = hb
        # Signals taken by earlier calls of this lap: they are marked delivered
        # only when the lap commits, so a second wait in the same lap must skip them.
        self._taken: set[int] = set()
        #: What children collected in this lap spent; the lap charges it to the
        #: parent's ledger in its commit (``engine.children.charge``).
        self.children_spent: list[tuple[int, int, int]] = []
        #: Whether a call of this lap reached the ledger (an effect, made,
        #: replayed or reconciled) or started children: the lap then commits
        #: durably (``LapCommit.durable``), so its history is on disk before
        #: its next lap is sent.
        self.acted = False

    def run(self, pc: PendingCall) -> Done | Pause:
        tool = self.agent.tool(pc.call.name)
        recorded = self.claim.effects.get(effect_key(self.run_id, pc.lap, pc.index))
        if recorded is not None or (tool is not None and tool.journaled):
            self.acted = True
        if tool is None and recorded is not None:
            # The ledger first: a deploy removed the tool while this call was
            # recorded; what happened must be reconciled, not "unknown tool".
            return self._without_tool(pc, recorded)
        if tool is None:
            names = ", ".join(t.name for t in self.agent.tools) or "none"
            return result(pc, f"Unknown tool {pc.call.name!r}. Available tools: {names}.",
                          error=True)
        refused = admit.refusal(pc.call.arguments)
        if refused is not None:
            return result(pc, f"Invalid arguments for {tool.name}: {refused}", error=True)
        try:
            args = tool.validate(pc.call.arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'arguments'}: {x['msg']}"
                                 for x in e.errors())
            return result(pc, f"Invalid arguments for {tool.name}: {problems}", error=True)
        if tool.control == "sleep":
            return sleep(self.rt, pc, args)
        if tool.control == "signal":
            return wait_for_signal(self.rt, self.run_id, self._taken, pc, args)
        if tool.control == "state":
            return write_state(self.state, pc, tool, args)
        approval: ApprovalRecord | None = None
        if tool.requires_approval:
            verdict = self._approval(pc, tool)
            if not isinstance(verdict, ApprovalRecord):
                return verdict
            approval = verdict
            if approval.approved_arguments is not None:
                # The approver's edit replaces the model's arguments: the intent
                # (and its hash) records these, so every replay runs the same call.
                try:
                    args = tool.validate(approval.approved_arguments)
                except ValidationError as e:
                    return result(pc, f"Not done: the approved arguments for {tool.name} no "
                                      f"longer fit the tool: {e.errors()[0]['msg']}", error=True)
        beat = (None if self.hb is None else
                CallBeat(self.rt, self.agent, self.hb, call_index=pc.index, tool=tool.name))
        ctx = ToolContext(run_id=self.run_id, lap=pc.lap, call_index=pc.index,
                          idempotency_key=effect_key(self.run_id, pc.lap, pc.index),
                          tenant=self.claim.run.tenant, beat=beat,
                          state=None if tool.journaled else self.state)
        if not tool.journaled:
            done: Done | Pause = self._invoke_read(pc, tool, args, ctx)
        else:
            done = self._invoke_journaled(pc, tool, args, ctx)
        if approval is None or isinstance(done, Pause):
            return done
        return with_decision(done, approval)

    # --- pauses -------------------------------------------------------------

    def _approval(self, pc: PendingCall, tool: Tool) -> ApprovalRecord | Done | Pause:
        key = effect_key(self.run_id, pc.lap, pc.index)
        found = self.rt.store.approval_for(key)
        if found is None:
            now = self.rt.clock.now()
            approval = ApprovalRecord(
                id=uuid.uuid4().hex, run_id=self.run_id, effect_key=key, tool_name=tool.name,
                arguments=dict(pc.call.arguments), reason=f"{tool.kind} tool {tool.name}",
                owner=self.agent.approval_owner, status="pending",
                on_timeout=self.agent.on_approval_timeout, escalate_to=self.agent.escalate_to,
                requested_at=now, timeout_at=now + self.agent.approval_timeout,
                decided_by=None, comment=None, decided_at=None)
            paused = pc.model_copy(update={"paused_at": now})
            return Pause("waiting", WaitingFor.approval(approval.id), None, paused, approval)
        if found.status == "pending":
            return Pause("waiting", WaitingFor.approval(found.id), None, pc)
        if found.status == "approved":
            return found
        return result(pc, f"Not done: the call to {tool.name} was {decision(found)}.",
                      error=True)

    def _without_tool(self, pc: PendingCall, row: EffectRecord) -> Done | Pause:
        """A recorded call whose tool this agent no longer has: reuse what is
        known; a call that may have landed waits for a human (no lookup left)."""
        if row.status in ("applied", "compensated"):
            return self._sized(pc, row.result)
        if row.status in ("failed", "not_applied"):
            return result(pc, row.error or f"{row.tool_name} was not applied", error=True)
        if row.status == "pending":
            self._finish(row.key, "unknown", None,
                         error=f"tool {row.tool_name} was removed while this call was in "
                               "flight; whether it landed is unknown")
        return Pause("waiting", WaitingFor.effect(row.key), None, pc)

    # --- execution ------------------------------------------------------------

    def _invoke_read(self, pc: PendingCall, tool: Tool, args: BaseModel,
                     ctx: ToolContext) -> Done | Pause:
        try:
            value = self._invoke(tool, args, ctx)
        except ToolError as e:
            return result(pc, self._error_text(e), error=True)
        if isinstance(value, StartChildren):
            return self._start_children(pc, ctx.idempotency_key, value, journaled=False)
        return self._sized(pc, self._admit(value))

    def _admit(self, value: Any) -> Any:
        """What the ledger keeps of a tool's value (``engine.admit``)."""
        return admit.tool_result(value, self.rt.settings, self.agent.redact)

    def _error_text(self, e: BaseException) -> str:
        return admit.error_text(e, self.rt.settings, self.agent.redact)

    def _sized(self, pc: PendingCall, value: Any) -> Done:
        """The model's view of an admitted value: a refused one (too large or
        too deep, now or when it was first recorded) is a tool error."""
        refused = admit.refusal(value)
        if refused is not None:
            return result(pc, refused, error=True)
        return result(pc, value)

    def _invoke_journaled(self, pc: PendingCall, tool: Tool, args: BaseModel,
                          ctx: ToolContext) -> Done | Pause:
        arguments = args.model_dump(mode="json")
        digest = args_hash(tool.name, arguments)
        key = ctx.idempotency_key
        row = self.claim.effects.get(key)
        if row is None or row.status in ("pending", "not_applied"):
            # Also for a pending row: counts the attempt, and re-checks the lease
            # before a replay decides anything.
            row, created = self.rt.store.begin_effect(
                EffectIntent(key=key, run_id=self.run_id, lap=pc.lap, call_index=pc.index,
                             tool_name=tool.name, tool_version=tool.version, kind=tool.kind,
                             args_hash=digest, args=arguments),
                owner=self.claim.owner, now=self.rt.clock.now())
            if created:
                fault("after_intent", scope=tool.name)
                return self._call(pc, tool, args, ctx)
        if row.args_hash != digest:
            raise IdempotencyConflictError(
                f"effect {key}: replay asks {tool.name} with different arguments than the "
                "first attempt; refusing")
        return self._replay(pc, tool, args, ctx, row)

    def _replay(self, pc: PendingCall, tool: Tool, args: BaseModel, ctx: ToolContext,
                row: EffectRecord) -> Done | Pause:
        if row.status == "applied" and children.is_marker(row.result):
            return self._await_children(pc, row.result)
        if row.status in ("applied", "compensated"):
            # Admitted again: a row written before results were bounded may be large.
            return self._sized(pc, self._admit(row.result))
        if row.status == "failed":
            return result(pc, row.error or "failed", error=True)
        if row.status == "pending" and tool.lookup_fn is not None:
            found = tool.lookup_fn(row.key)
            if found is not None:
                kept = self._admit(found)
                self._finish(row.key, "applied", kept)
                return self._sized(pc, kept)
            return self._call(pc, tool, args, ctx)
        if row.status == "pending" and tool.kind == "idempotent":
            return self._call(pc, tool, args, ctx)
        if row.status == "pending":
            self._finish(row.key, "unknown", None,
                         error="worker died mid-call; the tool has no lookup and is not "
                               "idempotent, so whether it landed is unknown")
        return Pause("waiting", WaitingFor.effect(row.key), None, pc)

    def _invoke(self, tool: Tool, args: BaseModel, ctx: ToolContext) -> Any:
        """The tool's function under its policy (timeout, retries: ``engine.policy``)."""
        check = self.hb.check if self.hb is not None else _nothing
        return policy.invoke(tool, args, ctx, check=check)

    def _call(self, pc: PendingCall, tool: Tool, args: BaseModel,
              ctx: ToolContext) -> Done | Pause:
        try:
            value = self._invoke(tool, args, ctx)
        except ToolTimeoutError as e:
            return self._timed_out(pc, tool, ctx, e)
        except ToolError as e:
            error = self._error_text(e)
            self._finish(ctx.idempotency_key, "failed", None, error=error)
            return result(pc, error, error=True)
        if isinstance(value, StartChildren):
            return self._start_children(pc, ctx.idempotency_key, value, journaled=True)
        fault("after_apply", scope=tool.name)
        kept = self._admit(value)
        self._finish(ctx.idempotency_key, "applied", kept)
        fault("after_outcome", scope=tool.name)
        return self._sized(pc, kept)

    def _timed_out(self, pc: PendingCall, tool: Tool, ctx: ToolContext,
                   e: ToolTimeoutError) -> Done | Pause:
        """An effectful call outlived its timeout (and its retries): its thread
        runs on and may still land, so it is neither failed nor re-called blindly.
        The ledger's rules for a call in flight decide: a lookup that finds it
        adopts it; an idempotent tool stays pending and the lap is retried (its
        replay asks the lookup or calls again with the same key); anything else
        is marked unknown and the run waits for ``effects resolve``."""
        key = ctx.idempotency_key
        if tool.lookup_fn is not None:
            found = tool.lookup_fn(key)
            if found is not None:
                kept = self._admit(found)
                self._finish(key, "applied", kept)
                return self._sized(pc, kept)
        if tool.kind == "idempotent":
            raise EffectTimeoutError(f"effect {key}: {e}; it stays pending and the lap is "
                                     "retried with the same key") from e
        self._finish(key, "unknown", None,
                     error=f"{self._error_text(e)}; the call may still land, so whether it "
                           "did is unknown")
        return Pause("waiting", WaitingFor.effect(key), None, pc)

    # --- child runs (engine.children) -------------------------------------------

    def _start_children(self, pc: PendingCall, key: str, request: StartChildren, *,
                        journaled: bool) -> Done | Pause:
        """Start the children once (a limit or bad input is the model's tool
        error), record the marker, then wait for them."""
        self.acted = True
        try:
            marker = children.begin(self.rt, self.claim, key, request)
        except InvalidInputError as e:
            error = self._error_text(e)
            if journaled:
                self._finish(key, "failed", None, error=error)
            return result(pc, error, error=True)
        if journaled:
            self._finish(key, "applied", marker)
        return self._await_children(pc, marker)

    def _await_children(self, pc: PendingCall, marker: dict[str, Any]) -> Done | Pause:
        got = children.outcome(self.rt, marker)
        if isinstance(got, WaitingFor):
            paused = pc if pc.paused_at else pc.model_copy(
                update={"paused_at": self.rt.clock.now()})
            return Pause("waiting", got, None, paused)
        self.children_spent.append(got.spent)
        return self._sized(pc, self._admit(got.result))

    def _finish(self, key: str, status: EffectStatus, result: Any,
                error: str | None = None) -> None:
        self.rt.store.finish_effect(key, status=status, result=_jsonable(result), error=error,
                                    now=self.rt.clock.now())


def _nothing() -> None:
    """No lease to check (a runner used outside a lap)."""


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


__all__ = ["CallRunner", "Done", "Pause", "args_hash"]
