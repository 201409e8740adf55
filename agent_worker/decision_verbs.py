"""The decision verbs of the public API (a part of ``AgentWorker``): approve
or reject a paused call, send a signal, cancel, retry, raise a budget, and
record a human's verdict on an effect whose outcome was unknown.

Each decides under the handle's principal (a ``by`` argument is deprecated
and ignored), commits with its audit entry, then sends the lap it made due."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from agent_worker.access import ref, scoped
from agent_worker.core.authorization import Action
from agent_worker.core.budget import Budget
from agent_worker.core.deprecation import ignored_by
from agent_worker.core.errors import (
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    UnknownRunError,
)
from agent_worker.core.untrusted import check_name, check_text, payload_bytes
from agent_worker.core.vocabulary import RETRYABLE
from agent_worker.engine.newrun import json_size as _json_size
from agent_worker.steering import argument_edit
from agent_worker.store.base import ApprovalRecord, EffectRecord, RunRecord, SignalRecord
from agent_worker.verbbase import Verbs, storable


class DecisionVerbs(Verbs):
    """Human decisions on paused calls, signals, and an operator's interventions."""

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
        if not storable(status, run_id):
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


__all__ = ["DecisionVerbs"]
