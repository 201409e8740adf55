"""The history verbs of the public API (a part of ``AgentWorker``): a run's
checkpoints, messages, effects and events, its live stream, the audit log,
and a fork from an earlier lap."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from agent_worker.access import check_id, scoped
from agent_worker.core.checkpoint import Checkpoint, dump_checkpoint, load_checkpoint
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.core.errors import NotFoundError, PayloadTooLargeError, ReplayRefusedError
from agent_worker.engine.newrun import json_size as _json_size
from agent_worker.store.base import (
    AuditRecord,
    EffectRecord,
    EventRecord,
    NewRun,
    RunRecord,
    StoredMessage,
)
from agent_worker.streaming import DEFAULT_POLL_SECONDS, StreamEvent
from agent_worker.streaming import stream as _stream
from agent_worker.verbbase import Verbs, storable


class HistoryVerbs(Verbs):
    """What a run did, as recorded; and a new run from any point of it."""

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
        if not storable(principal, action):
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


__all__ = ["HistoryVerbs"]
