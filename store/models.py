"""Tables of runs and what they record, as SQLAlchemy 2 typed models. Alembic
migrations are the source of the deployed schema; these models must match
them (a test compares the two). The whole schema, with the tables other
modules declare beside their code, is ``store.tables``.

The base, its naming convention and the UTC timestamp type are
``store.modelbase``'s (re-exported here).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, Integer, String, Text, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped, mapped_column

from agent_worker.store.modelbase import NAMING as NAMING
from agent_worker.store.modelbase import Base as Base
from agent_worker.store.modelbase import UTCDateTime as UTCDateTime
from agent_worker.store.sharemodels import ProviderPauseRow as ProviderPauseRow
from agent_worker.store.sharemodels import RateChargeRow as RateChargeRow
from agent_worker.store.sharemodels import ShareLimitRow as ShareLimitRow

_ENDED = text("status IN ('succeeded', 'failed', 'cancelled')")
_PAUSED = text("status IN ('waiting', 'sleeping')")


class Run(Base):
    """One row per run: what workers claim and operators list."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(String(200))
    agent_name: Mapped[str] = mapped_column(String(200))
    agent_version: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(20))
    wake_at: Mapped[datetime | None]
    waiting_for: Mapped[str | None] = mapped_column(String(300))
    input: Mapped[Any]
    result: Mapped[Any | None]
    error_code: Mapped[str | None] = mapped_column(String(100))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[str | None] = mapped_column(Text)
    limits: Mapped[dict[str, Any]]
    ending: Mapped[str | None] = mapped_column(String(20))
    cancel_requested_at: Mapped[datetime | None]
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    cancelled_by: Mapped[str | None] = mapped_column(String(200))
    parent_run_id: Mapped[str | None] = mapped_column(String(200))
    forked_from_lap: Mapped[int | None] = mapped_column(Integer)
    retention: Mapped[str] = mapped_column(String(20), default="full")
    recoveries: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    #: Caller-given ``{"key": "value"}`` tags, as shown; a search
    #: walks their rows in ``run_labels`` (``store.labelrows``).
    labels: Mapped[dict[str, str] | None] = mapped_column(
        JSON().with_variant(postgresql.JSONB(), "postgresql"))

    #: Fair share (``store.admission``): higher goes first within its tenant.
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The lap admission let this run send (it holds a slot while this equals
    #: ``next_lap``); ``-1`` waits for a slot (throttled); NULL never gated.
    admitted_lap: Mapped[int | None] = mapped_column(Integer)

    # What every lap writes, last, and the lease (the claim and heartbeats
    # write only that) at the very end: a HOT update logs the bytes between
    # the old and new row's common prefix and suffix (migration
    # 0022_lap_columns_last; the order on disk is the migrations').
    next_lap: Mapped[int] = mapped_column(Integer)
    laps_used: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime]
    last_checkpoint_at: Mapped[datetime | None]
    enqueued_at: Mapped[datetime | None]
    lap_attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_runs_status_wake", "status", "wake_at"),
        Index("ix_runs_agent_status", "agent_name", "status"),
        Index("ix_runs_created", "created_at", "id"),
        Index("ix_runs_parent", "parent_run_id"),

        # Each tenant's line in admission's order, after the slots held
        # (queued with admitted_lap >= 0): migration 0019_waiting_line.
        Index("ix_runs_admission", "status", "admitted_lap", "tenant", text("priority DESC"),
              "created_at", "id"),
        # A tenant's runs newest first; partial ones by status, which no lap's
        # two updates of a run in flight touch (migration 0015_scale_indexes).
        Index("ix_runs_tenant_created", "tenant", "created_at", "id"),
        Index("ix_runs_tenant_ended", "tenant", "status", "created_at", "id",
              postgresql_where=_ENDED, sqlite_where=_ENDED),
        Index("ix_runs_tenant_paused", "tenant", "status", "created_at", "id",
              postgresql_where=_PAUSED, sqlite_where=_PAUSED),
        # Room on each page for the lap's two HOT updates (migration 0018_lap_hot).
        {"postgresql_with": {"fillfactor": 80}},
    )


class CheckpointRow(Base):
    """One row per committed lap; lap 0 is written when the run starts."""

    __tablename__ = "checkpoints"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    lap: Mapped[int] = mapped_column(Integer, primary_key=True)
    schema_version: Mapped[int] = mapped_column(Integer)
    state: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class MessageRow(Base):
    """Append-only conversation log, numbered per run; a lap writes only its own."""

    __tablename__ = "messages"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    lap: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class EffectRow(Base):
    """Write-ahead ledger of side-effecting calls, unique on the idempotency key."""

    __tablename__ = "effects"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(200))
    lap: Mapped[int] = mapped_column(Integer)
    call_index: Mapped[int] = mapped_column(Integer)
    tool_name: Mapped[str] = mapped_column(String(200))
    tool_version: Mapped[str] = mapped_column(String(50))
    kind: Mapped[str] = mapped_column(String(20))
    args_hash: Mapped[str] = mapped_column(String(64))
    args: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20))
    result: Mapped[Any | None]
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    compensates: Mapped[str | None] = mapped_column(String(300))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (Index("ix_effects_run_lap", "run_id", "lap"),)


class EventRow(Base):
    """Append-only audit log: why the agent did what it did, and when."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(String(200))
    lap: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(50))
    data: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]

    __table_args__ = (Index("ix_events_run", "run_id", "id"),)


class ApprovalRow(Base):
    """A pending or decided human decision on a proposed tool call."""

    __tablename__ = "approvals"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(200), index=True)
    effect_key: Mapped[str] = mapped_column(String(300), unique=True)
    tool_name: Mapped[str] = mapped_column(String(200))
    arguments: Mapped[dict[str, Any]]
    reason: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20))
    on_timeout: Mapped[str] = mapped_column(String(20))
    escalate_to: Mapped[str | None] = mapped_column(String(200))
    requested_at: Mapped[datetime]
    timeout_at: Mapped[datetime | None]
    decided_by: Mapped[str | None] = mapped_column(String(200))
    comment: Mapped[str | None] = mapped_column(Text)
    decided_at: Mapped[datetime | None]

    #: What the approver changed the call to (``None``: approved as asked);
    #: the call runs with these, and ``arguments`` keeps what the model asked.
    approved_arguments: Mapped[dict[str, Any] | None]

    __table_args__ = (Index("ix_approvals_status", "status", "timeout_at"),)


class SignalRow(Base):
    """A durable inbound signal; delivered into exactly one lap."""

    __tablename__ = "signals"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    payload: Mapped[Any | None]
    created_at: Mapped[datetime]
    delivered_lap: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index("ix_signals_run_name", "run_id", "name", "delivered_lap"),)


class ServedVersionRow(Base):
    """A live worker's heartbeat for one agent version it serves: the sweeper
    re-sends a lap only to a queue some live worker consumes."""

    __tablename__ = "served_versions"

    worker: Mapped[str] = mapped_column(String(300), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(50), primary_key=True)
    seen_at: Mapped[datetime]

    __table_args__ = (Index("ix_served_versions_agent", "agent_name", "agent_version",
                            "seen_at"),)


class ScheduleRow(Base):
    """A durable cron schedule: the firing pass claims its
    ``next_fire_at`` row by row, so two beats never fire one time twice."""

    __tablename__ = "schedules"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(String(200), index=True)
    agent_name: Mapped[str] = mapped_column(String(200))
    agent_version: Mapped[str | None] = mapped_column(String(50))
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(200))
    input: Mapped[Any | None]
    catchup: Mapped[str] = mapped_column(String(10))
    catchup_limit: Mapped[int] = mapped_column(Integer)
    overlap: Mapped[str] = mapped_column(String(10))
    paused: Mapped[bool]
    next_fire_at: Mapped[datetime]
    last_fire_at: Mapped[datetime | None]
    last_run_id: Mapped[str | None] = mapped_column(String(200))
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (Index("ix_schedules_due", "paused", "next_fire_at"),)


class StateEditRow(Base):
    """An operator's edit of a run's plan, facts or a note: applied
    by the next lap's fenced commit, which sets ``applied_lap``, so an edit is
    never applied under a running lap, never lost and never applied twice."""

    __tablename__ = "state_edits"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(String(200))
    edit: Mapped[dict[str, Any]]
    requested_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    applied_lap: Mapped[int | None] = mapped_column(Integer)
    #: Set when the run finished before any lap could apply the edit (it
    #: arrived during the final lap): recorded, never applied, never silent.
    dropped_lap: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index("ix_state_edits_run", "run_id", "applied_lap"),)


class ChildRunRow(Base):
    """A run started by another run: which call of the parent started
    it (``group_key``, the call's effect key), its place in that call's list,
    its depth, and the principal it acts for (inherited from the parent)."""

    __tablename__ = "child_runs"

    child_run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    parent_run_id: Mapped[str] = mapped_column(String(200))
    group_key: Mapped[str] = mapped_column(String(300))
    position: Mapped[int] = mapped_column(Integer)
    depth: Mapped[int] = mapped_column(Integer)
    principal: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]

    __table_args__ = (Index("ix_child_runs_group", "group_key", "position"),
                      Index("ix_child_runs_parent", "parent_run_id"))


class AuditRow(Base):
    """Append-only record of every human or operator action, refusals
    included. Postgres refuses UPDATE and TRUNCATE of it, and DELETE of an entry
    younger than the owner's ``audit_log_retention()``; the retention prune
    goes through the owner's ``audit_log_prune`` (migrations ``0003_tenancy``,
    ``0024_append_only_audit``)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime]
    tenant: Mapped[str | None] = mapped_column(String(200))
    principal: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(50))
    outcome: Mapped[str] = mapped_column(String(20))
    run_id: Mapped[str | None] = mapped_column(String(200))
    target: Mapped[str | None] = mapped_column(String(300))
    reason: Mapped[str | None] = mapped_column(Text)
    changes: Mapped[dict[str, Any] | None]

    __table_args__ = (Index("ix_audit_log_tenant", "tenant", "id"),
                      Index("ix_audit_log_run", "run_id", "id"),
                      Index("ix_audit_log_at", "at"))
