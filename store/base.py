"""The narrow interface the lap engine needs from persistence; its values
are ``store.values``'s, re-exported here.

Every method that writes owns its transaction and retries retriable database
errors; fenced writes check that the caller still holds the run's lease for
this lap and report ``False`` (or raise ``LeaseLost``) when it does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import RUNNABLE as RUNNABLE
from agent_worker.core.vocabulary import TERMINAL as TERMINAL
from agent_worker.core.vocabulary import EffectStatus as EffectStatus
from agent_worker.core.vocabulary import RunStatus as RunStatus
from agent_worker.store.auditbase import AuditEntry as AuditEntry
from agent_worker.store.auditbase import AuditRecord as AuditRecord
from agent_worker.store.auditbase import AuditStore
from agent_worker.store.childbase import ChildStore
from agent_worker.store.queued import QueuedMessages
from agent_worker.store.schedtypes import ScheduleStore
from agent_worker.store.values import ApprovalRecord as ApprovalRecord
from agent_worker.store.values import Claim as Claim
from agent_worker.store.values import DueLap as DueLap
from agent_worker.store.values import EffectIntent as EffectIntent
from agent_worker.store.values import EffectRecord as EffectRecord
from agent_worker.store.values import EventRecord as EventRecord
from agent_worker.store.values import LapCommit as LapCommit
from agent_worker.store.values import NewRun as NewRun
from agent_worker.store.values import RunRecord as RunRecord
from agent_worker.store.values import RunUpdate as RunUpdate
from agent_worker.store.values import SignalRecord as SignalRecord
from agent_worker.store.values import StoredMessage as StoredMessage


class LapStore(Protocol):
    """Persistence as a lap, the sweeper and the retention task need it: claim,
    journal, commit, release, heartbeat, and the few reads a lap makes."""

    def dispose(self) -> None:
        """Close every pooled connection (at process exit or test teardown)."""
        ...

    def get_run(self, run_id: str) -> RunRecord | None: ...

    def claim(
        self, run_id: str, lap: int, *, owner: str, now: datetime, lease_seconds: float,
        window_messages: int, served: Sequence[str] | None = None,
    ) -> Claim | None:
        """Take the lease on ``run_id`` at ``lap`` and load what the lap needs.

        Returns ``None`` when the run is not at that lap, not runnable, not yet
        due, or leased by a live worker: a stale or duplicate delivery; or,
        given ``served`` (``"agent@version"`` items), pinned to a version the
        caller does not serve (old code never claims a migrated run).
        An implementation may hand back what its own last commit of the run
        wrote instead of reading it again, only when the claim itself shows
        nothing was written since (``store.lapcache``): the ``Claim`` is the
        same either way.
        """
        ...

    def renew_lease(
        self, run_id: str, lap: int, *, owner: str, now: datetime, lease_seconds: float
    ) -> Literal["ok", "lost", "cancelled"]: ...

    def renew_leases(
        self, leases: Sequence[tuple[str, int, str]], *, now: datetime, lease_seconds: float
    ) -> dict[str, Literal["ok", "lost", "cancelled"]]:
        """``renew_lease`` for many ``(run_id, lap, owner)`` at once (one
        statement; the heartbeat of a threads worker): each lap's state by owner."""
        ...

    def journal_model_output(
        self, run_id: str, lap: int, *, owner: str, seq: int, message: Message, now: datetime
    ) -> Message:
        """Record the lap's model output at ``seq`` (fenced); if an earlier attempt
        already did, return that one instead. Raises ``LeaseLost``."""
        ...

    def begin_effect(self, intent: EffectIntent, *, owner: str, now: datetime,
                     fence_cancel: bool = True) -> tuple[EffectRecord, bool]:
        """Commit the pending intent (fenced) or return the existing row;
        the flag says whether the caller must make the call: the intent is new,
        or the existing one is ``not_applied`` (now pending again).

        Raises:
            IdempotencyConflictError: the key exists with different arguments.
            LeaseLost: the caller no longer holds the lease.
        """
        ...

    def finish_effect(
        self, key: str, *, status: EffectStatus, result: Any, error: str | None,
        now: datetime,
    ) -> None:
        """Record an effect's outcome. Not fenced: what happened in the world is
        recorded even if the lease was lost meanwhile."""
        ...

    def commit_lap(self, commit: LapCommit) -> bool:
        """Write the lap atomically; ``False`` if the fence failed (nothing written)."""
        ...

    def release(
        self, run_id: str, lap: int, *, owner: str, now: datetime, outcome: RunUpdate,
        event: dict[str, Any], reset_attempts: bool = False, fence_cancel: bool = True,
    ) -> bool:
        """End the lap without committing it (retry later, pause, fail)."""
        ...

    def sweep(self, *, now: datetime, handoff_seconds: float, resend_max_seconds: float,
              limit: int = 500, queued: QueuedMessages | None = None) -> list[DueLap]:
        """Recover expired leases, wake due sleepers, time out approvals and
        signal waits, and pick queued runs whose message is lost: for a
        version ``queued`` read, as many as its queue lacks, oldest hand-off
        first (``store.handoffs``); for any other, those unclaimed
        ``handoff_seconds`` after the send, then backing off up to
        ``resend_max_seconds``. Returns only laps of versions a live worker
        serves, marked as sent; safe when two sweepers run at once. Every
        comparison is on the database's clock; ``now`` is the caller's."""
        ...

    def heartbeat(self, worker: str, versions: Sequence[tuple[str, str]], *,
                  now: datetime) -> None:
        """Record that ``worker`` is alive and serves ``versions`` (agent, version)."""
        ...

    def forget_worker(self, worker: str) -> None:
        """Drop a stopping worker's heartbeat rows."""
        ...

    def prune(self, *, checkpoints_before: datetime, ledger_before: datetime,
              batch: int) -> dict[str, int]: ...

    def pending_signals(self, run_id: str, name: str) -> list[SignalRecord]: ...

    def approval_for(self, effect_key: str) -> ApprovalRecord | None: ...

    def list_messages(self, run_id: str, *, start: int = 0, end: int | None = None
                      ) -> list[StoredMessage]: ...

    def list_effects(self, run_id: str) -> list[EffectRecord]: ...

    def record_event(self, run_id: str, lap: int | None, kind: str, data: dict[str, Any],
                     *, now: datetime) -> None: ...


class Store(LapStore, ScheduleStore, ChildStore, AuditStore, Protocol):
    """Everything above plus what the public API and the CLI need: starting
    runs, queries, human decisions and history."""

    def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Insert a run with checkpoint 0 and its first messages.

        Returns the run and whether it was created (False: ``new.id`` existed,
        which makes ``start_run`` with a caller-chosen id idempotent).
        """
        ...

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
        """Runs, newest first; ``parent`` keeps its child runs (and forks)."""
        ...

    def decide_approval(
        self, approval_id: str | None, run_id: str | None, *, approved: bool, by: str,
        comment: str | None, now: datetime,
        edit: Callable[[ApprovalRecord], dict[str, Any]] | None = None,
    ) -> tuple[ApprovalRecord, DueLap | None]: ...

    def find_approval(self, approval_id: str | None, run_id: str | None) -> ApprovalRecord:
        """The approval a decision names (by id, or the run's); raises ``NotFoundError``."""
        ...

    def list_approvals(self, *, status: str = "pending", run_id: str | None = None,
                       limit: int = 100, tenant: str | None = None) -> list[ApprovalRecord]: ...

    def send_signal(self, run_id: str, name: str, payload: Any, *, now: datetime,
                    max_pending: int | None = None) -> tuple[SignalRecord, DueLap | None]: ...

    def request_cancel(self, run_id: str, *, reason: str, by: str,
                       now: datetime) -> DueLap | None: ...

    def requeue(self, run_id: str, *, now: datetime, from_statuses: Sequence[RunStatus],
                event: dict[str, Any], limits: dict[str, Any] | None = None,
                replay: bool = False) -> DueLap:
        """Queue a paused or failed run again. With ``replay`` (``retry``), refuse
        a run whose history no longer stands.

        Raises:
            InvalidStateError: the run is in none of ``from_statuses``.
            ReplayRefusedError: ``replay`` and an effect was compensated or the
                history was pruned.
        """
        ...

    def resolve_effect(self, key: str, *, applied: bool, result: Any, by: str,
                       now: datetime) -> EffectRecord: ...

    def list_checkpoints(self, run_id: str) -> list[tuple[int, int, datetime]]: ...

    def get_checkpoint(self, run_id: str, lap: int) -> dict[str, Any] | None: ...

    def list_events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]: ...
