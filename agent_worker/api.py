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

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
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
from agent_worker.deprecation import ignored_by
from agent_worker.engine import children
from agent_worker.engine.newrun import admit_input, admitted_run, new_run
from agent_worker.engine.newrun import json_size as _json_size
from agent_worker.engine.sweep import sweep
from agent_worker.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidStateError,
    NotFoundError,
    PayloadTooLargeError,
    ReplayRefusedError,
    UnknownRunError,
)
from agent_worker.principal import Principal
from agent_worker.runtime import Runtime
from agent_worker.schedule_verbs import ScheduleVerbs
from agent_worker.settings import get_settings
from agent_worker.shareapi import FairShareVerbs, check_priority
from agent_worker.steering import (
    RunStateView,
    argument_edit,
    check_labels,
    state_edit,
    state_view,
)
from agent_worker.store.base import (
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
from agent_worker.store.edits import StateEdit
from agent_worker.store.listing import RunFilter, RunPage
from agent_worker.store.schedtypes import ScheduleRecord
from agent_worker.store.sql import SqlStore
from agent_worker.streaming import DEFAULT_POLL_SECONDS, StreamEvent
from agent_worker.streaming import stream as _stream
from agent_worker.tasks.dispatch import CeleryDispatcher
from agent_worker.tracing import check_traceparent, current_traceparent
from agent_worker.untrusted import check_name, check_text, clean, clean_text, payload_bytes
from agent_worker.vocabulary import RETRYABLE, RUN_STATUSES, TERMINAL, RunStatus


def _storable(*values: str | None) -> bool:
    return all(v is None or (isinstance(v, str) and clean_text(v) == v) for v in values)


class AgentWorker(AccessControl, ScheduleVerbs, FairShareVerbs):
    """A handle on one store and one dispatcher, acting as one principal;
    module functions use a default one (``connect`` binds another).
    Principals, scoping, authorization and audit: ``agent_worker.access``;
    schedule verbs: ``ScheduleVerbs``; fair-share limits: ``FairShareVerbs``."""

    def _principal(self, by: object = None) -> str:
        """The one place the actor of a verb comes from: the id of the handle's
        principal, recorded as ``by``. A ``by`` argument (from a verb written
        before principals) is ignored: what the store records never comes from
        free text."""
        return self.principal.id
    @scoped
    def start_run(self, agent: str | Agent, input: Any = None, *, run_id: str | None = None,
                  tenant: str | None = None, version: str | None = None,
                  budget: Budget | None = None,
                  labels: Mapping[str, str] | None = None,
                  traceparent: str | None = None, priority: int = 0) -> RunRecord:
        """Create a run and send its first lap; with a ``run_id`` a retried call
        returns the existing run instead of starting a second one.

        ``labels`` (``{"customer": "acme-42"}``) tag the run for ``search_runs``
        (``steering.check_labels`` gives the rules). ``traceparent`` (W3C trace
        context; by default the caller's active OpenTelemetry span, if any) is
        stored with the run, so every lap's trace hangs under the caller's span
        (``agent_worker.tracing``). ``priority`` (-1000..1000, default 0) orders the
        run among its tenant's runs waiting for a slot (``agent_worker.fairshare``):
        higher goes first.

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
        priority = check_priority(priority)
        checked_labels = check_labels(labels, self.rt.settings)
        input = admit_input(spec, input, self.rt.settings)
        traceparent = (check_traceparent(traceparent) if traceparent is not None
                       else current_traceparent())
        # A caller narrows the agent's limits, never lifts them (issue 16).
        new = new_run(spec, input, run_id=run_id, tenant=tenant, budget=budget,
                      now=self.rt.clock.now(), labels=checked_labels)
        with self._recorded("start", None, tenant=tenant, target=run_id,
                            changes={"agent": spec.name, "version": spec.version,
                                     "limits": new.limits}):
            run, created = self.rt.store.create_run(
                replace(new, traceparent=traceparent, priority=priority))
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
    def start_child(self, parent_run_id: str, agent: str | Agent, input: Any = None, *,
                    key: str, version: str | None = None, budget: Budget | None = None
                    ) -> RunRecord:
        """Start a child run of ``parent_run_id`` from application code, once per
        ``key`` (a retried call returns the same child). The child inherits the
        parent's tenant, the caller's principal and an even share of what is left
        of the parent's budget (``budget`` only tightens it); cancelling the
        parent cancels it. Unlike a tool's children, the parent does not wait
        for it, and its spend is not charged to the parent (nobody collects it).

        Raises:
            UnknownRunError, InvalidStateError (the parent ended), ChildLimitError.
        """
        parent = self.get_run(parent_run_id)
        key = check_id(key, "key")
        self._authorize("start", parent, target=key)
        if parent.finished or parent.cancel_requested_at is not None:
            raise InvalidStateError(f"run {parent.id} is {parent.status}; it starts no children")
        spec = self.rt.registry.get(agent.name if isinstance(agent, Agent) else agent,
                                    agent.version if isinstance(agent, Agent) else version)
        state = self.rt.store.get_checkpoint(parent.id, parent.lap)
        ledger = (load_checkpoint(state).budget if state is not None
                  else BudgetLedger(started_at=self.rt.clock.now()))
        limits = spec.budget.tightened_by(children.budget_share(parent.limits, ledger, 1))
        group = f"{parent.id}:api:{key}"
        new = admitted_run(self.rt, spec, input, run_id=children.child_id(group, 0),
                           tenant=parent.tenant, limits=limits.tightened_by(budget))
        s = self.rt.settings
        due = self.rt.store.start_children(
            parent.id, group, [new], now=self.rt.clock.now(), owner=None,
            max_depth=s.max_child_depth, max_per_run=s.max_children_per_run,
            principal=self._principal("api"))
        self.rt.send_all(due)
        return self.get_run(new.id)

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
                  stale: bool = False, limit: int = 100, parent: str | None = None
                  ) -> list[RunRecord]:
        """Runs of the principal's tenant, newest first; ``stale`` keeps
        runnable runs with no checkpoint for longer than ``stale_after_seconds``;
        ``parent`` keeps the runs it started (child runs) or forked.
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
        if not _storable(status, agent, agent_version, tenant, parent):
            return []  # nothing stored can match
        return self.rt.store.list_runs(status=status, agent=agent, agent_version=agent_version,
                                       tenant=tenant, stale_before=stale_before, limit=limit,
                                       parent=parent)

    @scoped
    def search_runs(self, *, labels: Mapping[str, str] | None = None,
                    status: RunStatus | None = None, agent: str | None = None,
                    agent_version: str | None = None, tenant: str | None = None,
                    created_after: datetime | None = None,
                    created_before: datetime | None = None,
                    cursor: str | None = None, limit: int = 100) -> RunPage:
        """Runs matching every filter given, newest first, one page at a time:
        pass the page's ``next_cursor`` back for the next (``None`` on the last).
        Filters are checked like what they match (a label that could never be
        stored is refused), and ``limit`` is 1..1000.

        Raises:
            InvalidInputError: a malformed filter, cursor or limit.
        """
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError(f"limit must be 1-1000, got {limit!r}")
        if status is not None and status not in RUN_STATUSES:
            raise InvalidInputError(f"status must be one of {', '.join(RUN_STATUSES)}; "
                                    f"got {clean_text(str(status))[:40]!r}")
        for when, what in ((created_after, "created_after"), (created_before, "created_before")):
            if when is not None and (not isinstance(when, datetime) or when.tzinfo is None):
                raise InvalidInputError(f"{what} must be a timezone-aware datetime")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidInputError("cursor must be a string from an earlier page")
        self._authorize("read", None)
        if not self.principal.all_tenants:
            if tenant not in (None, self.principal.tenant):
                return RunPage([], None)
            tenant = self.principal.tenant
        found = RunFilter(labels=check_labels(labels, self.rt.settings), status=status,
                          agent=agent, agent_version=agent_version, tenant=tenant,
                          created_after=created_after, created_before=created_before)
        if not _storable(status, agent, agent_version, tenant):
            return RunPage([], None)  # nothing stored can match
        return self._sql().search_runs(found, cursor=cursor, limit=limit)

    def _sql(self) -> SqlStore:
        """The store's SQL side, for the verbs outside the lap's narrow protocol."""
        store = self.rt.store
        if not isinstance(store, SqlStore):
            raise ConfigurationError("this verb needs the SQL store")
        return store

    @scoped
    def get_state(self, run_id: str) -> RunStateView:
        """The run's latest committed plan, next action, facts, budget and
        pending calls, in one query, whatever the run is doing (a lap in flight
        is not waited for: its state is visible once it commits).

        Raises:
            UnknownRunError: no such run.
        """
        found = self._sql().run_state(ref(run_id))
        if found is not None and not self.principal.sees(found.run.tenant):
            found = None  # another tenant's run is unknown, as everywhere
        view = state_view(found, run_id)
        assert found is not None  # state_view raised otherwise
        self._authorize("read", found.run)
        return view

    @scoped
    def update_state(self, run_id: str, *, facts: Mapping[str, Any] | None = None,
                     plan: Sequence[str | Mapping[str, Any]] | None = None,
                     note: str | None = None) -> StateEdit:
        """An operator's edit of a run's state, applied by the run's next lap
        commit (never under a running lap), recorded in the events: ``facts``
        are merged (a ``None`` value unpins), ``plan`` replaces the plan, and
        ``note`` is shown to the model as a message from the operator. A run
        that waits (an approval, a timer) gets it when it resumes.

        Raises:
            UnknownRunError: no such run.
            InvalidStateError: the run has finished.
            StateLimitError: a malformed edit or one over a bound.
        """
        run = self._visible(run_id)
        self._authorize("edit_state", run)
        sql = self._sql()
        edit = state_edit(sql.run_state(ref(run_id)), run_id, self.rt.settings,
                          plan=plan, facts=facts, note=note)
        with self._recorded("edit_state", run,
                            reason=clean_text(note) if isinstance(note, str) else None,
                            changes={"plan": plan is not None, "facts": sorted(facts or {}),
                                     "note": note is not None}):
            return sql.request_state_edit(run_id, edit, by=self._principal(),
                                          now=self.rt.clock.now())

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

    def approve(self, approval_or_run: str, *, comment: str | None = None,
                arguments: Mapping[str, Any] | None = None,
                by: str | None = None) -> ApprovalRecord:
        """Approve the pending call (by approval id, or the run's only pending one).

        With ``arguments`` the call runs with these instead of the model's:
        validated against the tool's schema (``InvalidInputError`` otherwise,
        nothing decided); the approval keeps the original and the approved
        arguments and who decided; the effect's key stays ``run:lap:call`` and
        its intent records the approved arguments, so a replay runs those.

        ``by`` is deprecated and ignored (``DeprecationWarning``): the decision
        is recorded as the handle's principal (``connect(principal)``).

        Raises:
            PermissionDeniedError: the principal is not a member of the
                approval's owner (or escalation target) or has no approver role.
        """
        ignored_by("approve", by)
        edit = None
        if arguments is not None:
            arguments = self._admit(arguments, "arguments")
            if _json_size(arguments, "arguments") > self.rt.settings.max_input_bytes:
                raise PayloadTooLargeError(f"arguments exceed the input limit of "
                                           f"{self.rt.settings.max_input_bytes} bytes")
            edit = argument_edit(self.rt.registry, self._agent_of, arguments)
        return self._decide(approval_or_run, True, comment, edit)

    def _agent_of(self, run_id: str) -> tuple[str, str]:
        run = self.get_run(run_id)
        return run.agent_name, run.agent_version

    def reject(self, approval_or_run: str, *, comment: str | None = None,
               by: str | None = None) -> ApprovalRecord:
        """Reject the pending call; the model is told who rejected it and why.
        ``by`` is deprecated and ignored, as ``approve``'s."""
        ignored_by("reject", by)
        return self._decide(approval_or_run, False, comment)

    @scoped
    def _decide(self, ident: str, approved: bool, comment: str | None,
                edit: Callable[[ApprovalRecord], dict[str, Any]] | None = None
                ) -> ApprovalRecord:
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
                                     "status": "approved" if approved else "rejected",
                                     **({"arguments": "edited"} if edit else {})}):
            record, due = self.rt.store.decide_approval(
                found.id, None, approved=approved, by=by, comment=comment,
                now=self.rt.clock.now(), edit=edit)
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
    def cancel(self, run_id: str, *, reason: str, by: str | None = None) -> RunRecord:
        """Stop the run at the next lap boundary and undo its compensatable effects.
        ``by`` is deprecated and ignored: the handle's principal is recorded."""
        ignored_by("cancel", by)
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
    def retry(self, run_id: str, *, by: str | None = None) -> RunRecord:
        """Resume a failed (or attention-needing) run from its last checkpoint.
        (``by`` is deprecated and ignored: who did it is the handle's principal.)

        Raises:
            ReplayRefusedError: effects of the run were compensated, or its
                history was pruned (``fork`` from an earlier lap instead).
        """
        ignored_by("retry", by)
        run = self._visible(run_id)
        by = self._principal()
        self._authorize("retry", run)
        with self._recorded("retry", run, changes={"from": run.status, "lap": run.next_lap}):
            due = self.rt.store.requeue(run_id, now=self.rt.clock.now(),
                                        from_statuses=RETRYABLE,
                                        event={"kind": "retried", "by": by}, replay=True)
        self.rt.send_all([due])
        return self.get_run(run_id)

    @scoped
    def raise_budget(self, run_id: str, *, by: str | None = None, **limits: Any) -> RunRecord:
        """Raise a paused run's limits (e.g. ``max_laps=400``) and resume it.

        An operator verb (the ``raise_budget`` action): unlike
        ``start_run(budget=...)`` it may lift the agent's limits. (``by`` is
        deprecated and ignored: who did it is the handle's principal.)"""
        ignored_by("raise_budget", by)
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
    def resolve_effect(self, key: str, *, applied: bool, result: Any = None,
                       by: str | None = None) -> EffectRecord:
        """A human's verdict on an effect whose outcome was unknown. (``by`` is
        deprecated and ignored: who decided is the handle's principal.)"""
        ignored_by("resolve_effect", by)
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
    def stream(self, run_id: str, *, after: int = 0,
               poll_seconds: float = DEFAULT_POLL_SECONDS) -> Iterator[StreamEvent]:
        """Every event of ``run_id`` after event id ``after`` as it commits (lap
        commits with their tool calls and results, pauses, signals, decisions),
        ending with an ``end`` event once the run has finished; resume with the
        last id seen: no gap, no duplicate (``agent_worker.streaming``).

        Raises:
            UnknownRunError: no such run.
            InvalidInputError: ``after`` is not an event id.
        """
        return _stream(self, run_id, after=after, poll_seconds=poll_seconds)

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


class DefaultClient:
    """The handle behind the module-level functions (``start_run``, ``approve``...).

    Built from settings on first use and owned here, so it has one lifetime:
    ``replace`` swaps it (closing a handle this object built, which nobody
    else owns), ``close`` ends it. A process that switches databases, or a test,
    says so through these instead of resetting a module global by hand.
    """

    def __init__(self) -> None:
        self._client: AgentWorker | None = None
        self._owned = False

    def get(self) -> AgentWorker:
        """The current handle, built from settings (store and Celery broker) if none."""
        if self._client is None:
            settings = get_settings()
            _load_agents(settings.agent_modules)
            store = SqlStore(settings.database_url)
            self._client = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(),
                                               settings=settings,
                                               clock=DatabaseClock(store.current_time)))
            self._owned = True
        return self._client

    def replace(self, client: AgentWorker | None) -> None:
        """Use ``client`` from now on (``None``: build one on next use)."""
        self.close()
        self._client, self._owned = client, False

    def close(self) -> None:
        """Close the handle if this object built it (its heartbeat and connections)."""
        if self._client is not None and self._owned:
            self._client.rt.close()
        self._client, self._owned = None, False


_default = DefaultClient()


def configure(client: AgentWorker | None) -> None:
    """Set (or with ``None`` reset) the handle the module-level functions use."""
    _default.replace(client)


def client() -> AgentWorker:
    """The default handle: the configured store and the Celery broker."""
    return _default.get()


def connect(principal: Principal | None = None, *,
            authorizer: Authorizer | None = None) -> AgentWorker:
    """A handle on the configured store and broker acting as ``principal``
    (default: the configured one, ``AGENT_WORKER_PRINCIPAL_*``); ``authorizer``
    replaces the built-in roles (``agent_worker.authorization``)."""
    base = client()
    return base.acting_as(principal or base.principal, authorizer=authorizer)


def _load_agents(modules: str) -> None:
    registry.load_agents(modules.split(","))


def start_run(agent: str | Agent, input: Any = None, *, run_id: str | None = None,
              tenant: str | None = None, version: str | None = None,
              budget: Budget | None = None,
              labels: Mapping[str, str] | None = None,
              traceparent: str | None = None, priority: int = 0) -> RunRecord:
    """Start a run on the default handle; see ``AgentWorker.start_run``."""
    return client().start_run(agent, input, run_id=run_id, tenant=tenant, version=version,
                              budget=budget, labels=labels, traceparent=traceparent,
                              priority=priority)


def start_child(parent_run_id: str, agent: str | Agent, input: Any = None, *, key: str,
                version: str | None = None, budget: Budget | None = None) -> RunRecord:
    """Start a child run on the default handle; see ``AgentWorker.start_child``."""
    return client().start_child(parent_run_id, agent, input, key=key, version=version,
                                budget=budget)


def get_run(run_id: str) -> RunRecord:
    return client().get_run(run_id)


def get_state(run_id: str) -> RunStateView:
    """The run's latest committed state; see ``AgentWorker.get_state``."""
    return client().get_state(run_id)


def update_state(run_id: str, *, facts: Mapping[str, Any] | None = None,
                 plan: Sequence[str | Mapping[str, Any]] | None = None,
                 note: str | None = None) -> StateEdit:
    """An operator's state edit; see ``AgentWorker.update_state``."""
    return client().update_state(run_id, facts=facts, plan=plan, note=note)


def search_runs(**filters: Any) -> RunPage:
    """One page of runs; see ``AgentWorker.search_runs``."""
    return client().search_runs(**filters)


def stream(run_id: str, *, after: int = 0) -> Iterator[StreamEvent]:
    """Follow a run on the default handle; see ``AgentWorker.stream``."""
    return client().stream(run_id, after=after)


def wait(run_id: str, timeout: float | None = None) -> RunRecord:
    return client().wait(run_id, timeout)


def list_runs(**filters: Any) -> list[RunRecord]:
    return client().list_runs(**filters)


def approve(approval_or_run: str, *, comment: str | None = None,
            arguments: Mapping[str, Any] | None = None,
            by: str | None = None) -> ApprovalRecord:
    return client().approve(approval_or_run, comment=comment, arguments=arguments, by=by)


def reject(approval_or_run: str, *, comment: str | None = None,
           by: str | None = None) -> ApprovalRecord:
    return client().reject(approval_or_run, comment=comment, by=by)


def send_signal(run_id: str, name: str, payload: Any = None) -> SignalRecord:
    return client().send_signal(run_id, name, payload)


def cancel(run_id: str, *, reason: str, by: str | None = None) -> RunRecord:
    return client().cancel(run_id, reason=reason, by=by)


def retry(run_id: str, *, by: str | None = None) -> RunRecord:
    return client().retry(run_id, by=by)


def fork(run_id: str, lap: int, *, new_run_id: str | None = None, version: str | None = None,
         facts: dict[str, Any] | None = None) -> RunRecord:
    """Fork on the default handle; see ``AgentWorker.fork``."""
    return client().fork(run_id, lap, new_run_id=new_run_id, version=version, facts=facts)


def schedule(name: str, agent: str, cron: str = "0 2 * * *", input: Any = None,
             **options: Any) -> ScheduleRecord:
    """Create a schedule on the default handle; see ``AgentWorker.schedule``."""
    return client().schedule(name, agent, cron, input, **options)


def list_schedules(**filters: Any) -> list[ScheduleRecord]:
    return client().list_schedules(**filters)


def pause_schedule(name: str) -> ScheduleRecord:
    return client().pause_schedule(name)


def resume_schedule(name: str) -> ScheduleRecord:
    return client().resume_schedule(name)


def delete_schedule(name: str) -> None:
    client().delete_schedule(name)


def trigger_schedule(name: str) -> RunRecord | None:
    return client().trigger_schedule(name)


__all__ = ["AgentWorker", "approve", "cancel", "client", "configure", "connect",
           "delete_schedule",
           "fork", "get_run", "get_state", "list_runs", "list_schedules", "pause_schedule",
           "reject", "resume_schedule", "retry", "schedule", "search_runs", "send_signal",
           "start_child", "start_run", "stream", "trigger_schedule", "update_state",
           "wait"]
