"""The SQLAlchemy implementation of ``Store`` for Postgres (production) and
SQLite (in-process mode): the lap's side (``store.lapsql``) plus what the
public API and the CLI need (starting runs, queries, decisions, history).
Each public method owns exactly one transaction (``store.sqlbase``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agent_worker.core.errors import RunIdUnavailableError
from agent_worker.core.vocabulary import RUNNABLE, RunStatus
from agent_worker.store import audit, listing, pauses, runstatus, state
from agent_worker.store.base import (
    ApprovalRecord,
    AuditEntry,
    AuditRecord,
    DueLap,
    EffectRecord,
    EventRecord,
    NewRun,
    RunRecord,
    SignalRecord,
)
from agent_worker.store.childstore import SqlChildStore
from agent_worker.store.edits import StateEdit
from agent_worker.store.lapsql import SqlLapStore
from agent_worker.store.leasebatch import SqlLeaseBatch
from agent_worker.store.rows import (
    checkpoints,
    events,
    runs,
    to_event,
    to_run,
)
from agent_worker.store.runinsert import create_run_tx
from agent_worker.store.schedules import SqlScheduleStore
from agent_worker.store.sharing import SqlShareStore


class SqlStore(SqlScheduleStore, SqlChildStore, SqlShareStore, SqlLapStore, SqlLeaseBatch):
    """``Store`` over one SQLAlchemy engine; see ``SqlBase`` for how the lap's
    hot path saves round trips and fsyncs on Postgres; schedules live in
    ``SqlScheduleStore``."""

    def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        try:
            return self._tx(lambda c: create_run_tx(c, new))
        except IntegrityError as e:
            # Two callers raced with the same run id: the other one created it.
            # Or the id belongs to a run this transaction's tenant may not see
            # (row-level security hid it from the SELECT above): refused, and
            # nothing about that run is said.
            run = self.get_run(new.id)
            if run is None:
                raise RunIdUnavailableError(
                    f"run id {new.id!r} is not available; choose another") from e
            return run, False

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent: str | None = None,
        agent_version: str | None = None,
        tenant: str | None = None,
        stale_before: datetime | None = None,
        limit: int = 100,
        parent: str | None = None,
    ) -> list[RunRecord]:
        q = select(runs).order_by(runs.c.created_at.desc()).limit(limit)
        if parent is not None:
            q = q.where(runs.c.parent_run_id == parent)
        if status is not None:
            q = q.where(runstatus.status_is(status))
        if agent is not None:
            q = q.where(runs.c.agent_name == agent)
        if agent_version is not None:
            q = q.where(runs.c.agent_version == agent_version)
        if tenant is not None:
            q = q.where(runs.c.tenant == tenant)
        if stale_before is not None:
            q = q.where(
                runs.c.status.in_(RUNNABLE), runs.c.last_checkpoint_at < stale_before
            )
        return [to_run(r) for r in self._read(lambda c: c.execute(q).all())]

    def decide_approval(
        self, approval_id: str | None, run_id: str | None, *, approved: bool, by: str,
        comment: str | None, now: datetime,
        edit: Callable[[ApprovalRecord], dict[str, Any]] | None = None,
    ) -> tuple[ApprovalRecord, DueLap | None]:
        return self._tx(lambda c: pauses.decide_approval(
            c, approval_id, run_id, approved=approved, by=by, comment=comment, now=now,
            edit=edit))

    def find_approval(self, approval_id: str | None, run_id: str | None) -> ApprovalRecord:
        return self._read(lambda c: pauses.find_approval(c, approval_id, run_id))

    def list_approvals(self, *, status: str = "pending", run_id: str | None = None,
                       limit: int = 100, tenant: str | None = None) -> list[ApprovalRecord]:
        """With ``tenant``, only approvals of that tenant's runs."""
        return self._read(lambda c: pauses.list_approvals(c, status=status, run_id=run_id,
                                                          limit=limit, tenant=tenant))

    def send_signal(self, run_id: str, name: str, payload: Any, *, now: datetime,
                    max_pending: int | None = None) -> tuple[SignalRecord, DueLap | None]:
        return self._tx(lambda c: pauses.send_signal(c, run_id, name, payload, now=now,
                                                     max_pending=max_pending))

    def request_cancel(self, run_id: str, *, reason: str, by: str,
                       now: datetime) -> DueLap | None:
        return self._tx(lambda c: pauses.request_cancel(c, run_id, reason=reason, by=by, now=now))

    def requeue(self, run_id: str, *, now: datetime, from_statuses: Sequence[RunStatus],
                event: dict[str, Any], limits: dict[str, Any] | None = None,
                replay: bool = False) -> DueLap:
        return self._tx(lambda c: pauses.requeue(c, run_id, now=now, from_statuses=from_statuses,
                                                 event=event, limits=limits, replay=replay))

    def resolve_effect(self, key: str, *, applied: bool, result: Any, by: str,
                       now: datetime) -> EffectRecord:
        return self._tx(lambda c: pauses.resolve_effect(c, key, applied=applied, result=result,
                                                        by=by, now=now))

    def list_checkpoints(self, run_id: str) -> list[tuple[int, int, datetime]]:
        q = (select(checkpoints.c.lap, checkpoints.c.schema_version, checkpoints.c.created_at)
             .where(checkpoints.c.run_id == run_id).order_by(checkpoints.c.lap))
        return [(r.lap, r.schema_version, r.created_at) for r in self._read(lambda c: c.execute(q))]

    def get_checkpoint(self, run_id: str, lap: int) -> dict[str, Any] | None:
        q = select(checkpoints.c.state).where(checkpoints.c.run_id == run_id,
                                              checkpoints.c.lap == lap)
        state: dict[str, Any] | None = self._read(lambda c: c.execute(q).scalar())
        return state

    def list_events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]:
        q = select(events).where(events.c.run_id == run_id, events.c.id > after_id).order_by(
            events.c.id)
        return [to_event(r) for r in self._read(lambda c: c.execute(q).all())]

    # --- labels and search, state queries and edits ---------------------------

    def search_runs(self, f: listing.RunFilter, *, cursor: str | None = None,
                    limit: int = 100, oldest: bool = False) -> listing.RunPage:
        """One page of runs matching ``f``, newest (or oldest) first (``store.listing``)."""
        return self._read(lambda c: listing.search_runs(c, f, cursor=cursor, limit=limit,
                                                        oldest=oldest))

    def run_state(self, run_id: str) -> state.RunState | None:
        """The run and its latest committed checkpoint, in one query."""
        return self._read(lambda c: state.run_state(c, run_id))

    def request_state_edit(self, run_id: str, edit: dict[str, Any], *, by: str,
                           now: datetime) -> StateEdit:
        """Store an operator's edit for the next lap (``store.state``)."""
        return self._tx(lambda c: state.request_edit(c, run_id, edit, by=by, now=now))

    def append_audit(self, entry: AuditEntry, *, now: datetime) -> None:
        self._tx(lambda c: audit.append_tx(c, entry, now))

    def list_audit(self, *, tenant: str | None, principal: str | None = None,
                   action: str | None = None, run_id: str | None = None,
                   since: datetime | None = None, limit: int = 100) -> list[AuditRecord]:
        return self._read(lambda c: audit.list_tx(c, tenant=tenant, principal=principal,
                                                  action=action, run_id=run_id, since=since,
                                                  limit=limit))


__all__ = ["SqlStore"]
