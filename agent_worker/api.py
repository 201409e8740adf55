"""The public API application code calls: start runs, read them, decide
approvals, send signals, cancel, retry, fork.

Every write commits to the store first and only then hands a lap to the
dispatcher; a send that never arrives is re-sent by the sweeper. Invalid input
raises ``InvalidInputError`` (or a subclass) before anything is written.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from agent_worker.agent import Agent, registry
from agent_worker.budget import Budget, BudgetLedger
from agent_worker.checkpoint import Checkpoint, dump_checkpoint, load_checkpoint
from agent_worker.clock import DatabaseClock
from agent_worker.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.engine.sweep import sweep
from agent_worker.errors import (
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    ReplayRefusedError,
    UnknownRunError,
)
from agent_worker.messages import Message
from agent_worker.runtime import Runtime
from agent_worker.settings import get_settings
from agent_worker.shareapi import FairShareVerbs, check_priority
from agent_worker.untrusted import check_name, check_text, clean, clean_text, payload_bytes
from agent_worker.vocabulary import TERMINAL, RunStatus
from store.base import (
    ApprovalRecord,
    DueLap,
    EffectRecord,
    EventRecord,
    NewRun,
    RunRecord,
    SignalRecord,
    StoredMessage,
)
from store.sql import SqlStore
from tasks.dispatch import CeleryDispatcher


def _check_id(value: str, what: str) -> str:
    return check_name(value, what, max_chars=200)


def _ref(value: str, what: str = "run", error: type[NotFoundError] = UnknownRunError) -> str:
    """A reference to something stored. One that can never have been stored (not
    a string, or holding U+0000 or a lone surrogate, which Postgres refuses even
    as a query parameter) is simply not found, the same on both dialects."""
    if not isinstance(value, str) or clean_text(value) != value:
        raise error(f"unknown {what} {clean_text(str(value))!r}")
    return value


def _storable(*values: str | None) -> bool:
    return all(v is None or (isinstance(v, str) and clean_text(v) == v) for v in values)


def _json_size(value: Any, what: str) -> int:
    try:
        return len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {e}") from e


class AgentWorker(FairShareVerbs):
    """A handle on one store and one dispatcher; module functions use a default one."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # --- runs ---------------------------------------------------------------

    def start_run(self, agent: str | Agent, input: Any = None, *, run_id: str | None = None,
                  tenant: str | None = None, version: str | None = None,
                  budget: Budget | None = None, priority: int = 0) -> RunRecord:
        """Create a run and send its first lap; with a ``run_id`` a retried call
        returns the existing run instead of starting a second one.

        ``priority`` (-1000..1000, default 0) orders the run among its tenant's
        runs waiting for a slot (``agent_worker.fairshare``): higher goes first.

        ``budget`` only tightens the agent's own limits (each limit the stricter
        of the two; ``None`` there means "no tighter"); to lift a limit an
        operator uses ``raise_budget``."""
        name = agent.name if isinstance(agent, Agent) else agent
        if isinstance(agent, Agent) and version is None:
            version = agent.version
        spec = self.rt.registry.get(name, version)
        run_id = _check_id(run_id, "run_id") if run_id is not None else uuid.uuid4().hex
        if tenant is not None:
            _check_id(tenant, "tenant")
        priority = check_priority(priority)
        input = self._admit(input, "input")
        size = _json_size(input, "input")
        if size > self.rt.settings.max_input_bytes:
            raise PayloadTooLargeError(
                f"input is {size} bytes; the limit is {self.rt.settings.max_input_bytes}")
        if spec.input_model is not None:
            try:
                input = spec.input_model.model_validate(input or {}).model_dump(mode="json")
            except ValidationError as e:
                raise InvalidInputError(f"invalid input for {name}: {e}") from e
        # A caller narrows the agent's limits, never lifts them (issue 16).
        limits = spec.budget.tightened_by(budget)
        now = self.rt.clock.now()
        first = Message(role="user", content=input if isinstance(input, str)
                        else json.dumps(input, sort_keys=True))
        checkpoint = Checkpoint(lap=0, agent_name=spec.name, agent_version=spec.version,
                                budget=BudgetLedger.start(limits, now), message_count=1)
        run, created = self.rt.store.create_run(NewRun(
            id=run_id, tenant=tenant, agent_name=spec.name, agent_version=spec.version,
            input=input, limits=limits.model_dump(mode="json"), retention=spec.retention,
            checkpoint=dump_checkpoint(checkpoint), schema_version=CHECKPOINT_SCHEMA_VERSION,
            messages=[first], now=now, priority=priority))
        if not created:
            if run.agent_name != spec.name:
                raise InvalidInputError(
                    f"run {run_id} already exists for agent {run.agent_name}, not {spec.name}")
            return run
        self._send_next(run)
        return run

    def _admit(self, value: Any, what: str) -> Any:
        """A caller's JSON value under the rule of ``agent_worker.untrusted``."""
        return clean(value, max_depth=self.rt.settings.max_json_depth, what=what, strict=True)

    def _principal(self, by: str) -> str:
        """Who acts: free text (an e-mail, a service name), bounded and storable."""
        return check_text(by, "by", max_chars=self.rt.settings.max_principal_chars)

    def _send_next(self, run: RunRecord) -> None:
        self.rt.send_all([DueLap(run.id, run.next_lap, run.agent_name, run.agent_version)])

    def get_run(self, run_id: str) -> RunRecord:
        """The run's current record. Raises ``UnknownRunError``."""
        run = self.rt.store.get_run(_ref(run_id))
        if run is None:
            raise UnknownRunError(f"unknown run {run_id!r}")
        return run

    def list_runs(self, *, status: RunStatus | None = None, agent: str | None = None,
                  agent_version: str | None = None, tenant: str | None = None,
                  stale: bool = False, limit: int = 100) -> list[RunRecord]:
        """Runs, newest first; ``stale`` keeps runnable runs with no checkpoint
        for longer than ``stale_after_seconds``."""
        stale_before = (self.rt.clock.now()
                        - timedelta(seconds=self.rt.settings.stale_after_seconds)
                        if stale else None)
        if not _storable(status, agent, agent_version, tenant):
            return []  # nothing stored can match
        return self.rt.store.list_runs(status=status, agent=agent, agent_version=agent_version,
                                       tenant=tenant, stale_before=stale_before, limit=limit)

    def wait(self, run_id: str, timeout: float | None = None, *, poll: float = 0.2,
             until: Callable[[RunRecord], bool] | None = None) -> RunRecord:
        """Block until the run finishes (or ``until(run)`` holds).

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        done = until or (lambda r: r.status in TERMINAL)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if done(run):
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run.status} at lap {run.lap}")
            self._idle(poll)

    def _idle(self, seconds: float) -> None:
        time.sleep(seconds)

    # --- pauses and decisions -----------------------------------------------

    def approve(self, approval_or_run: str, *, by: str, comment: str | None = None
                ) -> ApprovalRecord:
        """Approve the pending call (by approval id, or the run's only pending one)."""
        return self._decide(approval_or_run, True, by, comment)

    def reject(self, approval_or_run: str, *, by: str, comment: str | None = None
               ) -> ApprovalRecord:
        """Reject the pending call; the model is told who rejected it and why."""
        return self._decide(approval_or_run, False, by, comment)

    def _decide(self, ident: str, approved: bool, by: str, comment: str | None
                ) -> ApprovalRecord:
        by = self._principal(by)
        if comment is not None:
            comment = check_text(comment, "comment",
                                 max_chars=self.rt.settings.max_approval_comment_chars)
        _ref(ident, "approval or run", NotFoundError)
        is_run = self.rt.store.get_run(ident) is not None
        record, due = self.rt.store.decide_approval(
            None if is_run else ident, ident if is_run else None, approved=approved, by=by,
            comment=comment, now=self.rt.clock.now())
        if due is not None:
            self.rt.send_all([due])
        return record

    def list_approvals(self, *, status: str = "pending", run_id: str | None = None
                       ) -> list[ApprovalRecord]:
        """Approvals in ``status``, oldest first (the inbox)."""
        if not _storable(status, run_id):
            return []  # nothing stored can match
        return self.rt.store.list_approvals(status=status, run_id=run_id)

    def send_signal(self, run_id: str, name: str, payload: Any = None) -> SignalRecord:
        """Store a signal durably; a run waiting for ``name`` resumes, and one
        that waits later finds it. Each signal is delivered into one lap."""
        s = self.rt.settings
        _ref(run_id)
        check_name(name, "signal name", max_chars=s.max_signal_name_chars)
        payload = self._admit(payload, "payload")
        # The same measure and limit as a tool result: the payload reaches the
        # model as one.
        size = payload_bytes(payload)
        if size > s.max_tool_result_bytes:
            raise PayloadTooLargeError(
                f"signal payload is {size} bytes; the limit is {s.max_tool_result_bytes}")
        record, due = self.rt.store.send_signal(run_id, name, payload, now=self.rt.clock.now(),
                                                max_pending=s.max_pending_signals)
        if due is not None:
            self.rt.send_all([due])
        return record

    def cancel(self, run_id: str, *, reason: str, by: str = "api") -> RunRecord:
        """Stop the run at the next lap boundary and undo its compensatable effects."""
        _ref(run_id)
        reason = check_text(reason, "reason", max_chars=self.rt.settings.max_cancel_reason_chars)
        by = self._principal(by)
        due = self.rt.store.request_cancel(run_id, reason=reason, by=by,
                                           now=self.rt.clock.now())
        if due is not None:
            self.rt.send_all([due])
        return self.get_run(run_id)

    def retry(self, run_id: str, *, by: str = "api") -> RunRecord:
        """Resume a failed (or attention-needing) run from its last checkpoint.

        Raises:
            ReplayRefusedError: effects of the run were compensated, or its
                history was pruned (``fork`` from an earlier lap instead).
        """
        _ref(run_id)
        by = self._principal(by)
        due = self.rt.store.requeue(run_id, now=self.rt.clock.now(),
                                    from_statuses=("failed", "waiting"),
                                    event={"kind": "retried", "by": by}, replay=True)
        self.rt.send_all([due])
        return self.get_run(run_id)

    def raise_budget(self, run_id: str, *, by: str = "api", **limits: Any) -> RunRecord:
        """Raise a paused run's limits (e.g. ``max_laps=400``) and resume it.

        An operator verb: unlike ``start_run(budget=...)`` it may lift the agent's
        limits. Nothing checks who calls it yet: until principals and roles exist
        (issue 16, items 1 and 3: raise_budget needs the operator role), expose it
        only to operators, never to end users or tenants' application code."""
        by = self._principal(by)
        run = self.get_run(run_id)
        try:
            merged = Budget.model_validate({**run.limits, **limits})
        except ValidationError as e:
            raise InvalidInputError(f"invalid budget: {e}") from e
        due = self.rt.store.requeue(run_id, now=self.rt.clock.now(), from_statuses=("waiting",),
                                    event={"kind": "budget_raised", "by": by,
                                           "limits": merged.model_dump(mode="json")},
                                    limits=merged.model_dump(mode="json"))
        self.rt.send_all([due])
        return self.get_run(run_id)

    def resolve_effect(self, key: str, *, applied: bool, by: str, result: Any = None
                       ) -> EffectRecord:
        """A human's verdict on an effect whose outcome was unknown."""
        _ref(key, "effect", NotFoundError)
        by = self._principal(by)
        result = self._admit(result, "result")
        # It stands for the tool's result: the same measure and limit.
        if payload_bytes(result) > self.rt.settings.max_tool_result_bytes:
            raise PayloadTooLargeError(
                f"result exceeds the tool-result limit of "
                f"{self.rt.settings.max_tool_result_bytes} bytes")
        record = self.rt.store.resolve_effect(key, applied=applied, result=result, by=by,
                                              now=self.rt.clock.now())
        run = self.get_run(record.run_id)
        if run.status == "queued":
            self._send_next(run)
        return record

    # --- history --------------------------------------------------------------

    def checkpoints(self, run_id: str) -> list[tuple[int, int, Any]]:
        """(lap, schema version, committed at) of each kept checkpoint."""
        return self.rt.store.list_checkpoints(_ref(run_id))

    def state_at(self, run_id: str, lap: int) -> Checkpoint:
        """The run's state after ``lap`` committed laps."""
        state = self.rt.store.get_checkpoint(_ref(run_id), lap)
        if state is None:
            raise NotFoundError(f"run {run_id} has no checkpoint for lap {lap}")
        return load_checkpoint(state)

    def messages(self, run_id: str) -> list[StoredMessage]:
        return self.rt.store.list_messages(_ref(run_id))

    def effects(self, run_id: str) -> list[EffectRecord]:
        return self.rt.store.list_effects(_ref(run_id))

    def events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]:
        return self.rt.store.list_events(_ref(run_id), after_id=after_id)

    def fork(self, run_id: str, lap: int, *, new_run_id: str | None = None,
             version: str | None = None, facts: dict[str, Any] | None = None) -> RunRecord:
        """A new run starting from ``run_id``'s state after ``lap``; the original
        is untouched. The fork's effects get its own keys, so nothing the
        original did is re-applied by replay; its ledger stays as history.

        Raises:
            ReplayRefusedError: retention pruned the checkpoint or the messages
                the fork would start from.
        """
        parent = self.get_run(run_id)
        if self.rt.store.get_checkpoint(run_id, lap) is None and 0 <= lap < parent.lap:
            kept = [c[0] for c in self.rt.store.list_checkpoints(run_id)]
            raise ReplayRefusedError(
                f"run {run_id}: the checkpoint of lap {lap} was pruned by retention; "
                f"kept: {kept}")
        base = self.state_at(run_id, lap)
        spec = self.rt.registry.get(parent.agent_name, version or parent.agent_version)
        new_id = _check_id(new_run_id, "run_id") if new_run_id else uuid.uuid4().hex
        facts = self._admit(facts, "facts")
        if _json_size(facts, "facts") > self.rt.settings.max_input_bytes:
            raise PayloadTooLargeError(
                f"facts exceed the input limit of {self.rt.settings.max_input_bytes} bytes")
        now = self.rt.clock.now()
        history = self.rt.store.list_messages(run_id, end=base.message_count)
        if len(history) < base.message_count:
            # The fork would start from an empty (or holed) conversation.
            raise ReplayRefusedError(
                f"run {run_id}: its messages up to lap {lap} were pruned by retention; "
                "it cannot be forked")
        checkpoint = base.model_copy(update={
            "agent_version": spec.version,
            "facts": {**base.facts, **(facts or {})},
            "budget": base.budget.model_copy(update={"started_at": now})})
        run, created = self.rt.store.create_run(NewRun(
            id=new_id, tenant=parent.tenant, agent_name=spec.name, agent_version=spec.version,
            input=parent.input, limits=parent.limits, retention=parent.retention,
            checkpoint=dump_checkpoint(checkpoint), schema_version=CHECKPOINT_SCHEMA_VERSION,
            messages=[m.message for m in history], now=now, parent_run_id=run_id,
            forked_from_lap=lap, start_lap=lap))
        if created:
            self._send_next(run)
        return run

    def sweep(self) -> int:
        """One sweeper pass (``engine.sweep``); returns how many laps it sent."""
        return sweep(self.rt)

    @staticmethod
    def cost(run: RunRecord) -> Decimal:
        """The run's spend in currency units."""
        return Decimal(run.cost_micros) / 1_000_000


_default: AgentWorker | None = None


def configure(client: AgentWorker | None) -> None:
    """Set (or with ``None`` reset) the handle the module-level functions use."""
    global _default
    _default = client


def client() -> AgentWorker:
    """The default handle: the configured store and the Celery broker."""
    global _default
    if _default is None:
        settings = get_settings()
        _load_agents(settings.agent_modules)
        store = SqlStore(settings.database_url)
        _default = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(),
                                       settings=settings,
                                       clock=DatabaseClock(store.current_time)))
    return _default


def _load_agents(modules: str) -> None:
    registry.import_modules(modules.split(","))


def start_run(agent: str | Agent, input: Any = None, *, run_id: str | None = None,
              tenant: str | None = None, version: str | None = None,
              budget: Budget | None = None, priority: int = 0) -> RunRecord:
    """Start a run on the default handle; see ``AgentWorker.start_run``."""
    return client().start_run(agent, input, run_id=run_id, tenant=tenant, version=version,
                              budget=budget, priority=priority)


def get_run(run_id: str) -> RunRecord:
    return client().get_run(run_id)


def wait(run_id: str, timeout: float | None = None) -> RunRecord:
    return client().wait(run_id, timeout)


def list_runs(**filters: Any) -> list[RunRecord]:
    return client().list_runs(**filters)


def approve(approval_or_run: str, *, by: str, comment: str | None = None) -> ApprovalRecord:
    return client().approve(approval_or_run, by=by, comment=comment)


def reject(approval_or_run: str, *, by: str, comment: str | None = None) -> ApprovalRecord:
    return client().reject(approval_or_run, by=by, comment=comment)


def send_signal(run_id: str, name: str, payload: Any = None) -> SignalRecord:
    return client().send_signal(run_id, name, payload)


def cancel(run_id: str, *, reason: str, by: str = "api") -> RunRecord:
    return client().cancel(run_id, reason=reason, by=by)


def retry(run_id: str, *, by: str = "api") -> RunRecord:
    return client().retry(run_id, by=by)


def fork(run_id: str, lap: int, *, new_run_id: str | None = None, version: str | None = None,
         facts: dict[str, Any] | None = None) -> RunRecord:
    """Fork on the default handle; see ``AgentWorker.fork``."""
    return client().fork(run_id, lap, new_run_id=new_run_id, version=version, facts=facts)


__all__ = ["AgentWorker", "approve", "cancel", "client", "configure", "fork",
           "get_run", "list_runs", "reject", "retry", "send_signal", "start_run", "wait"]
