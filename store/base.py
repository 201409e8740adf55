"""The narrow interface the lap engine needs from persistence, and its values.

Every method that writes owns its transaction and retries retriable database
errors; fenced writes check that the caller still holds the run's lease for
this lap and report ``False`` (or raise ``LeaseLost``) when it does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal, Protocol

from agent_worker.messages import Message, token_estimate
from agent_worker.store.auditbase import AuditEntry as AuditEntry
from agent_worker.store.auditbase import AuditRecord as AuditRecord
from agent_worker.store.auditbase import AuditStore
from agent_worker.store.childbase import ChildStore
from agent_worker.store.edits import StateEdit
from agent_worker.store.schedtypes import ScheduleStore
from agent_worker.vocabulary import RUNNABLE as RUNNABLE
from agent_worker.vocabulary import TERMINAL as TERMINAL
from agent_worker.vocabulary import EffectStatus as EffectStatus
from agent_worker.vocabulary import RunStatus as RunStatus
from agent_worker.vocabulary import WaitingFor


@dataclass(frozen=True)
class RunRecord:
    """A run as application code and operators see it."""

    id: str
    tenant: str | None
    agent_name: str
    agent_version: str
    status: RunStatus
    next_lap: int
    lap_attempts: int
    waiting_for: str | None
    wake_at: datetime | None
    input: Any
    result: Any
    error_code: str | None
    error_message: str | None
    error_detail: str | None
    limits: dict[str, Any]
    laps_used: int
    input_tokens: int
    output_tokens: int
    cost_micros: int
    ending: str | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    cancelled_by: str | None
    parent_run_id: str | None
    forked_from_lap: int | None
    retention: str
    recoveries: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    enqueued_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_checkpoint_at: datetime | None
    finished_at: datetime | None
    labels: dict[str, str] | None = None
    #: Fair share (``store.admission``): higher is admitted first within its tenant.
    priority: int = 0
    #: ``THROTTLED`` (-1) while the run waits for a slot; ``next_lap`` while it holds one.
    admitted_lap: int | None = None

    @property
    def lap(self) -> int:
        """Number of committed laps (= the latest checkpoint's lap)."""
        return self.next_lap - 1

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class StoredMessage:
    seq: int
    lap: int
    message: Message

    @cached_property
    def tokens(self) -> int:
        """``token_estimate`` of the message, counted once: a window is rebuilt
        every lap from the same stored messages (the lap cache keeps them), so
        counting per lap would redo the same sums forty times a lap."""
        return token_estimate(self.message)


@dataclass(frozen=True)
class EffectRecord:
    key: str
    run_id: str
    lap: int
    call_index: int
    tool_name: str
    tool_version: str
    kind: str
    args_hash: str
    args: dict[str, Any]
    status: EffectStatus
    result: Any
    error: str | None
    attempts: int
    compensates: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class EffectIntent:
    """What is about to be done; committed before it is done."""

    key: str
    run_id: str
    lap: int
    call_index: int
    tool_name: str
    tool_version: str
    kind: str
    args_hash: str
    args: dict[str, Any]
    compensates: str | None = None


@dataclass(frozen=True)
class ApprovalRecord:
    id: str
    run_id: str
    effect_key: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str | None
    owner: str | None
    status: str
    on_timeout: str
    escalate_to: str | None
    requested_at: datetime
    timeout_at: datetime | None
    decided_by: str | None
    comment: str | None
    decided_at: datetime | None
    approved_arguments: dict[str, Any] | None = None  # the approver's edit; None: as asked


@dataclass(frozen=True)
class SignalRecord:
    id: int
    run_id: str
    name: str
    payload: Any
    created_at: datetime
    delivered_lap: int | None


@dataclass(frozen=True)
class EventRecord:
    id: int
    run_id: str
    lap: int | None
    kind: str
    data: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True)
class Claim:
    """What a successful claim hands the engine: everything lap ``lap`` needs.

    ``lap_messages`` are messages this lap already wrote on an earlier attempt
    (its journaled model output); ``window`` ends right before them.
    """

    run: RunRecord
    lap: int
    owner: str
    checkpoint: dict[str, Any]
    window: list[StoredMessage]
    lap_messages: list[StoredMessage]
    effects: dict[str, EffectRecord]
    state_edits: list[StateEdit] = field(default_factory=list)


@dataclass(frozen=True)
class NewRun:
    id: str
    tenant: str | None
    agent_name: str
    agent_version: str
    input: Any
    limits: dict[str, Any]
    retention: str
    checkpoint: dict[str, Any]
    schema_version: int
    messages: Sequence[Message]
    now: datetime
    parent_run_id: str | None = None
    forked_from_lap: int | None = None
    start_lap: int = 0
    labels: dict[str, str] | None = None
    #: The caller's W3C trace context, kept in the ``run_created`` event so
    #: every lap's trace hangs under the caller's span (``agent_worker.tracing``).
    traceparent: str | None = None
    priority: int = 0


@dataclass(frozen=True)
class RunUpdate:
    """How a lap commit or release leaves the run row."""

    status: RunStatus
    wake_at: datetime | None = None
    waiting_for: WaitingFor | None = None
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    error_detail: str | None = None
    ending: str | None = None
    enqueue: bool = False


@dataclass(frozen=True)
class LapCommit:
    """Everything one lap writes, in one fenced transaction."""

    run_id: str
    lap: int
    owner: str
    messages: Sequence[tuple[int, Message]]
    checkpoint: dict[str, Any]
    schema_version: int
    update: RunUpdate
    usage: tuple[int, int, int, int]  # laps, input tokens, output tokens, cost micros
    event: dict[str, Any]
    new_approvals: Sequence[ApprovalRecord] = ()
    delivered_signals: Sequence[int] = ()
    now: datetime = field(default_factory=lambda: datetime.now().astimezone())
    #: The version that ran this lap: a newer one that migrated the checkpoint
    #: moves the run's pin, so its laps go to that version's queue from now on.
    agent_version: str | None = None
    applied_edits: Sequence[int] = ()


@dataclass(frozen=True)
class DueLap:
    """A lap the sweeper (or a decision) wants sent to the broker."""

    run_id: str
    lap: int
    agent_name: str
    agent_version: str


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
              limit: int = 500) -> list[DueLap]:
        """Recover expired leases, wake due sleepers, time out approvals and
        signal waits, and pick queued runs whose hand-off expired unclaimed
        (``handoff_seconds`` after the send, then backing off up to
        ``resend_max_seconds``). Returns only laps of versions a live worker
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
