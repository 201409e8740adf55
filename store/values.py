"""The values that cross the ``Store`` protocol (``store.base``): the records
reads hand out, and what a lap, the sweeper and the API hand in (a claim, a
new run, a lap's commit, a lap due to be sent). Frozen where they are facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from agent_worker.core.messages import Message, token_estimate
from agent_worker.core.vocabulary import TERMINAL, EffectStatus, RunStatus, WaitingFor
from agent_worker.store.edits import StateEdit


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
    #: ``False``: the lap only read (no ledger row, approval, signal, edit or
    #: child; the run goes on to its next lap), so the commit need not wait
    #: for the WAL flush. A crash can then lose it and the lap runs again,
    #: model call included; nothing outside saw it but the next lap's message,
    #: which finds the run a lap behind and stops. The store commits durably
    #: whatever else the commit carries.
    durable: bool = True


@dataclass(frozen=True)
class DueLap:
    """A lap the sweeper (or a decision) wants sent to the broker."""

    run_id: str
    lap: int
    agent_name: str
    agent_version: str


__all__ = [
    "ApprovalRecord",
    "Claim",
    "DueLap",
    "EffectIntent",
    "EffectRecord",
    "EventRecord",
    "LapCommit",
    "NewRun",
    "RunRecord",
    "RunUpdate",
    "SignalRecord",
    "StoredMessage",
]
