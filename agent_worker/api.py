"""The public API application code calls: start runs, read them, decide
approvals, send signals, cancel, retry, fork.

Every write commits to the store first and only then hands a lap to the
dispatcher; a send that never arrives is re-sent by the sweeper. Invalid input
raises ``InvalidInputError`` (or a subclass) before anything is written.

Every call acts as the handle's principal (``agent_worker.principal``): it
sees only its tenant's runs (another tenant's run is "unknown", and the store's
transactions are narrowed to the tenant for Postgres row-level security,
``store.tenancy``), its authorizer decides what it may do
(``agent_worker.authorization``; a refusal raises ``PermissionDeniedError``
and is audited), and every action is appended to the audit log in the same
transaction as the action itself (``store.audit``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from agent_worker.access import AccessControl, check_id, ref, scoped
from agent_worker.agent import Agent, registry
from agent_worker.authorization import Action, Authorizer
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
from agent_worker.principal import Principal
from agent_worker.runtime import Runtime
from agent_worker.settings import get_settings
from agent_worker.untrusted import check_name, check_text, clean, clean_text, payload_bytes
from agent_worker.vocabulary import TERMINAL, RunStatus
from store.base import (
    ApprovalRecord,
    AuditRecord,
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


def _storable(*values: str | None) -> bool:
    return all(v is None or (isinstance(v, str) and clean_text(v) == v) for v in values)


def _json_size(value: Any, what: str) -> int:
    try:
        return len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {e}") from e


class AgentWorker(AccessControl):
    """A handle on one store and one dispatcher, acting as one principal;
    module functions use a default one (``connect`` binds another).
    Principals, scoping, authorization and audit: ``agent_worker.access``."""

    def _principal(self, by: object = None) -> str:
        """The one place the actor of a verb comes from: the id of the handle's
        principal, recorded as ``by``. A ``by`` argument (from a verb written
        before principals) is ignored: what the store records never comes from
        free text."""
        return self.principal.id
    @scoped
    def start_run(self, agent: str | Agent, input: Any = None, *, run_id: str | None = None,
                  tenant: str | None = None, version: str | None = None,
                  budget: Budget | None = None) -> RunRecord:
        """Create a run and send its first lap; with a ``run_id`` a retried call
        returns the existing run instead of starting a second one.

        ``budget`` only tightens the agent's own limits (each limit the stricter
        of the two; ``None`` there means "no tighter"); to lift a limit an
        operator uses ``raise_budget``.

        The run belongs to the principal's tenant; ``tenant`` may only repeat
        it (an admin acting across tenants names the tenant here). Run ids are
        global: an id another tenant uses raises ``RunIdUnavailableError``,
        which says nothing about that run."""
        name = agent.name if isinstance(agent, Agent) else agent
        if isinstance(agent, Agent) and version is None:
            version = agent.version
        spec = self.rt.registry.get(name, version)
        run_id = check_id(run_id, "run_id") if run_id is not None else uuid.uuid4().hex
        tenant = self._tenant_of_new_run(tenant)
        self._authorize("start", None, target=run_id)
        existing = self._existing(run_id, tenant)
        if existing is not None:
            if existing.agent_name != spec.name:
                raise InvalidInputError(
                    f"run {run_id} already exists for agent {existing.agent_name}, "
                    f"not {spec.name}")
            return existing
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
        with self._recorded("start", None, tenant=tenant, target=run_id,
                            changes={"agent": spec.name, "version": spec.version,
                                     "limits": limits.model_dump(mode="json")}):
            run, created = self.rt.store.create_run(NewRun(
                id=run_id, tenant=tenant, agent_name=spec.name, agent_version=spec.version,
                input=input, limits=limits.model_dump(mode="json"), retention=spec.retention,
                checkpoint=dump_checkpoint(checkpoint), schema_version=CHECKPOINT_SCHEMA_VERSION,
                messages=[first], now=now))
        if not created:
            self._claimable(run, tenant)  # raced with another tenant's start of this id
            if run.agent_name != spec.name:
                raise InvalidInputError(
                    f"run {run_id} already exists for agent {run.agent_name}, not {spec.name}")
            return run
        self._send_next(run)
        return run

    def _admit(self, value: Any, what: str) -> Any:
        """A caller's JSON value under the rule of ``agent_worker.untrusted``."""
        return clean(value, max_depth=self.rt.settings.max_json_depth, what=what, strict=True)

    def _send_next(self, run: RunRecord) -> None:
        self.rt.send_all([DueLap(run.id, run.next_lap, run.agent_name, run.agent_version)])

    @scoped
    def get_run(self, run_id: str) -> RunRecord:
        """The run's current record. Raises ``UnknownRunError`` (also for a
        run of another tenant)."""
        run = self._visible(run_id)
        self._authorize("read", run)
        return run

    @scoped
    def list_runs(self, *, status: RunStatus | None = None, agent: str | None = None,
                  agent_version: str | None = None, tenant: str | None = None,
                  stale: bool = False, limit: int = 100) -> list[RunRecord]:
        """Runs of the principal's tenant, newest first; ``stale`` keeps
        runnable runs with no checkpoint for longer than ``stale_after_seconds``.
        ``tenant`` narrows an admin's view across tenants; another tenant's
        name matches nothing for everyone else."""
        self._authorize("read", None)
        if not self.principal.all_tenants:
            if tenant not in (None, self.principal.tenant):
                return []
            tenant = self.principal.tenant
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

    def approve(self, approval_or_run: str, *, comment: str | None = None) -> ApprovalRecord:
        """Approve the pending call (by approval id, or the run's only pending one).

        Raises:
            PermissionDeniedError: the principal is not a member of the
                approval's owner (or escalation target) or has no approver role.
        """
        return self._decide(approval_or_run, True, comment)

    def reject(self, approval_or_run: str, *, comment: str | None = None) -> ApprovalRecord:
        """Reject the pending call; the model is told who rejected it and why."""
        return self._decide(approval_or_run, False, comment)

    @scoped
    def _decide(self, ident: str, approved: bool, comment: str | None) -> ApprovalRecord:
        by = self._principal()
        if comment is not None:
            comment = check_text(comment, "comment",
                                 max_chars=self.rt.settings.max_approval_comment_chars)
        ref(ident, "approval or run", NotFoundError)
        named = self.rt.store.get_run(ident)
        is_run = named is not None and self.principal.sees(named.tenant)
        found = self.rt.store.find_approval(None if is_run else ident, ident if is_run else None)
        run = self.rt.store.get_run(found.run_id)
        if run is None or not self.principal.sees(run.tenant):
            raise NotFoundError(f"unknown approval {ident!r}")
        action: Action = "approve" if approved else "reject"
        owners = tuple(o for o in (found.owner, found.escalate_to) if o)
        self._authorize(action, run, owners=owners, target=found.id)
        with self._recorded(action, run, target=found.id, reason=comment,
                            changes={"approval": found.id, "tool": found.tool_name,
                                     "status": "approved" if approved else "rejected"}):
            record, due = self.rt.store.decide_approval(
                found.id, None, approved=approved, by=by, comment=comment,
                now=self.rt.clock.now())
        if due is not None:
            self.rt.send_all([due])
        return record

    @scoped
    def list_approvals(self, *, status: str = "pending", run_id: str | None = None
                       ) -> list[ApprovalRecord]:
        """Approvals of the principal's tenant in ``status``, oldest first (the inbox)."""
        if not _storable(status, run_id):
            return []  # nothing stored can match
        if run_id is not None:
            try:
                self._visible(run_id)
            except UnknownRunError:
                return []
        self._authorize("read", None)
        return self.rt.store.list_approvals(status=status, run_id=run_id,
                                            tenant=self._own_tenant())

    @scoped
    def send_signal(self, run_id: str, name: str, payload: Any = None) -> SignalRecord:
        """Store a signal durably; a run waiting for ``name`` resumes, and one
        that waits later finds it. Each signal is delivered into one lap."""
        s = self.rt.settings
        run = self._visible(run_id)
        check_name(name, "signal name", max_chars=s.max_signal_name_chars)
        payload = self._admit(payload, "payload")
        # The same measure and limit as a tool result: the payload reaches the
        # model as one.
        size = payload_bytes(payload)
        if size > s.max_tool_result_bytes:
            raise PayloadTooLargeError(
                f"signal payload is {size} bytes; the limit is {s.max_tool_result_bytes}")
        self._authorize("signal", run, target=name)
        with self._recorded("signal", run, target=name, changes={"bytes": size}):
            record, due = self.rt.store.send_signal(run_id, name, payload,
                                                    now=self.rt.clock.now(),
                                                    max_pending=s.max_pending_signals)
        if due is not None:
            self.rt.send_all([due])
        return record

    @scoped
    def cancel(self, run_id: str, *, reason: str) -> RunRecord:
        """Stop the run at the next lap boundary and undo its compensatable effects."""
        run = self._visible(run_id)
        reason = check_text(reason, "reason", max_chars=self.rt.settings.max_cancel_reason_chars)
        by = self._principal()
        self._authorize("cancel", run)
        with self._recorded("cancel", run, reason=reason, changes={"from": run.status}):
            due = self.rt.store.request_cancel(run_id, reason=reason, by=by,
                                               now=self.rt.clock.now())
        if due is not None:
            self.rt.send_all([due])
        return self.get_run(run_id)

    @scoped
    def retry(self, run_id: str) -> RunRecord:
        """Resume a failed (or attention-needing) run from its last checkpoint.

        Raises:
            ReplayRefusedError: effects of the run were compensated, or its
                history was pruned (``fork`` from an earlier lap instead).
        """
        run = self._visible(run_id)
        by = self._principal()
        self._authorize("retry", run)
        with self._recorded("retry", run, changes={"from": run.status, "lap": run.next_lap}):
            due = self.rt.store.requeue(run_id, now=self.rt.clock.now(),
                                        from_statuses=("failed", "waiting"),
                                        event={"kind": "retried", "by": by}, replay=True)
        self.rt.send_all([due])
        return self.get_run(run_id)

    @scoped
    def raise_budget(self, run_id: str, **limits: Any) -> RunRecord:
        """Raise a paused run's limits (e.g. ``max_laps=400``) and resume it.

        An operator verb (the ``raise_budget`` action): unlike
        ``start_run(budget=...)`` it may lift the agent's limits."""
        by = self._principal()
        run = self._visible(run_id)
        self._authorize("raise_budget", run)
        try:
            merged = Budget.model_validate({**run.limits, **limits})
        except ValidationError as e:
            raise InvalidInputError(f"invalid budget: {e}") from e
        new_limits = merged.model_dump(mode="json")
        with self._recorded("raise_budget", run, changes={"from": run.limits, "to": new_limits}):
            due = self.rt.store.requeue(run_id, now=self.rt.clock.now(),
                                        from_statuses=("waiting",),
                                        event={"kind": "budget_raised", "by": by,
                                               "limits": new_limits},
                                        limits=new_limits)
        self.rt.send_all([due])
        return self.get_run(run_id)

    @scoped
    def resolve_effect(self, key: str, *, applied: bool, result: Any = None) -> EffectRecord:
        """A human's verdict on an effect whose outcome was unknown."""
        ref(key, "effect", NotFoundError)
        by = self._principal()
        # Keys are ``run:lap:call[...]`` and run ids hold no ':'.
        try:
            run = self._visible(key.split(":", 1)[0])
        except UnknownRunError:
            raise NotFoundError(f"unknown effect {key!r}") from None
        self._authorize("resolve", run, target=key)
        result = self._admit(result, "result")
        # It stands for the tool's result: the same measure and limit.
        if payload_bytes(result) > self.rt.settings.max_tool_result_bytes:
            raise PayloadTooLargeError(
                f"result exceeds the tool-result limit of "
                f"{self.rt.settings.max_tool_result_bytes} bytes")
        with self._recorded("resolve", run, target=key,
                            changes={"applied": applied, "result": result}):
            record = self.rt.store.resolve_effect(key, applied=applied, result=result, by=by,
                                                  now=self.rt.clock.now())
        run = self.get_run(record.run_id)
        if run.status == "queued":
            self._send_next(run)
        return record

    # --- history --------------------------------------------------------------

    @scoped
    def checkpoints(self, run_id: str) -> list[tuple[int, int, Any]]:
        """(lap, schema version, committed at) of each kept checkpoint."""
        return self.rt.store.list_checkpoints(self.get_run(run_id).id)

    @scoped
    def state_at(self, run_id: str, lap: int) -> Checkpoint:
        """The run's state after ``lap`` committed laps."""
        state = self.rt.store.get_checkpoint(self.get_run(run_id).id, lap)
        if state is None:
            raise NotFoundError(f"run {run_id} has no checkpoint for lap {lap}")
        return load_checkpoint(state)

    @scoped
    def messages(self, run_id: str) -> list[StoredMessage]:
        return self.rt.store.list_messages(self.get_run(run_id).id)

    @scoped
    def effects(self, run_id: str) -> list[EffectRecord]:
        return self.rt.store.list_effects(self.get_run(run_id).id)

    @scoped
    def events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]:
        return self.rt.store.list_events(self.get_run(run_id).id, after_id=after_id)

    @scoped
    def audit(self, *, principal: str | None = None, action: str | None = None,
              run_id: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditRecord]:
        """Audit entries of the principal's tenant (every tenant's for an admin
        across tenants), newest first. Needs the ``audit`` action."""
        if run_id is not None:
            self._visible(run_id)
        self._authorize("audit", None)
        if not _storable(principal, action):
            return []
        return self.rt.store.list_audit(tenant=self._own_tenant(), principal=principal,
                                        action=action, run_id=run_id, since=since,
                                        limit=limit)

    @scoped
    def fork(self, run_id: str, lap: int, *, new_run_id: str | None = None,
             version: str | None = None, facts: dict[str, Any] | None = None) -> RunRecord:
        """A new run starting from ``run_id``'s state after ``lap``; the original
        is untouched. The fork's effects get its own keys, so nothing the
        original did is re-applied by replay; its ledger stays as history.

        Raises:
            ReplayRefusedError: retention pruned the checkpoint or the messages
                the fork would start from.
        """
        parent = self._visible(run_id)
        self._authorize("fork", parent)
        if self.rt.store.get_checkpoint(run_id, lap) is None and 0 <= lap < parent.lap:
            kept = [c[0] for c in self.rt.store.list_checkpoints(run_id)]
            raise ReplayRefusedError(
                f"run {run_id}: the checkpoint of lap {lap} was pruned by retention; "
                f"kept: {kept}")
        base = self.state_at(run_id, lap)
        spec = self.rt.registry.get(parent.agent_name, version or parent.agent_version)
        new_id = check_id(new_run_id, "run_id") if new_run_id else uuid.uuid4().hex
        existing = self._existing(new_id, parent.tenant)
        if existing is not None:
            return existing
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
        with self._recorded("fork", parent, target=new_id,
                            changes={"lap": lap, "new_run": new_id, "version": spec.version,
                                     "facts": facts}):
            run, created = self.rt.store.create_run(NewRun(
                id=new_id, tenant=parent.tenant, agent_name=spec.name,
                agent_version=spec.version, input=parent.input, limits=parent.limits,
                retention=parent.retention, checkpoint=dump_checkpoint(checkpoint),
                schema_version=CHECKPOINT_SCHEMA_VERSION,
                messages=[m.message for m in history], now=now, parent_run_id=run_id,
                forked_from_lap=lap, start_lap=lap))
        if not created:
            self._claimable(run, parent.tenant)
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


def connect(principal: Principal | None = None, *,
            authorizer: Authorizer | None = None) -> AgentWorker:
    """A handle on the configured store and broker acting as ``principal``
    (default: the configured one, ``AGENT_WORKER_PRINCIPAL_*``); ``authorizer``
    replaces the built-in roles (``agent_worker.authorization``)."""
    base = client()
    return base.acting_as(principal or base.principal, authorizer=authorizer)


def _load_agents(modules: str) -> None:
    registry.import_modules(modules.split(","))


def start_run(agent: str | Agent, input: Any = None, *, run_id: str | None = None,
              tenant: str | None = None, version: str | None = None,
              budget: Budget | None = None) -> RunRecord:
    """Start a run on the default handle; see ``AgentWorker.start_run``."""
    return client().start_run(agent, input, run_id=run_id, tenant=tenant, version=version,
                              budget=budget)


def get_run(run_id: str) -> RunRecord:
    return client().get_run(run_id)


def wait(run_id: str, timeout: float | None = None) -> RunRecord:
    return client().wait(run_id, timeout)


def list_runs(**filters: Any) -> list[RunRecord]:
    return client().list_runs(**filters)


def approve(approval_or_run: str, *, comment: str | None = None) -> ApprovalRecord:
    return client().approve(approval_or_run, comment=comment)


def reject(approval_or_run: str, *, comment: str | None = None) -> ApprovalRecord:
    return client().reject(approval_or_run, comment=comment)


def send_signal(run_id: str, name: str, payload: Any = None) -> SignalRecord:
    return client().send_signal(run_id, name, payload)


def cancel(run_id: str, *, reason: str) -> RunRecord:
    return client().cancel(run_id, reason=reason)


def retry(run_id: str) -> RunRecord:
    return client().retry(run_id)


def fork(run_id: str, lap: int, *, new_run_id: str | None = None, version: str | None = None,
         facts: dict[str, Any] | None = None) -> RunRecord:
    """Fork on the default handle; see ``AgentWorker.fork``."""
    return client().fork(run_id, lap, new_run_id=new_run_id, version=version, facts=facts)


__all__ = ["AgentWorker", "approve", "cancel", "client", "configure", "connect", "fork",
           "get_run", "list_runs", "reject", "retry", "send_signal", "start_run", "wait"]
