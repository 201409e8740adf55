"""The fair-share tables (``store.sharing``, ``store.admitting``,
``store.ratelimit``): limits operators edit while the fleet runs, provider
keys paused by a 429, and what each admitted lap charged against rate limits.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from agent_worker.store.modelbase import Base


class ShareLimitRow(Base):
    """Per-tenant (``agent`` = ``*``) or per-(tenant, agent) fair-share limits,
    editable while the fleet runs; tenant ``*`` is every tenant's default."""

    __tablename__ = "share_limits"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    agent: Mapped[str] = mapped_column(String(200), primary_key=True)
    concurrency: Mapped[int | None] = mapped_column(Integer)
    weight: Mapped[float | None]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str | None] = mapped_column(String(200))
    #: Rate limits of a tenant row (``store.ratelimit``); ``None``: not set here.
    laps_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)


class ProviderPauseRow(Base):
    """A model provider key answered 429 with Retry-After: admission sends no
    lap of the agents using it until ``until`` (the database's clock), so the
    whole fleet slows down, not just the worker that got the 429."""

    __tablename__ = "provider_pauses"

    provider: Mapped[str] = mapped_column(String(200), primary_key=True)
    until: Mapped[datetime]


class RateChargeRow(Base):
    """What one admitted lap charged against its tenant's and provider key's
    rate limits (``store.ratelimit``): a sliding-window log keyed like the
    lap, so a re-admission or a replay charges nothing twice. ``tokens`` is
    the estimate at admission until the lap's commit sets the actual usage.
    Rows older than the window are pruned by admission."""

    __tablename__ = "rate_charges"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    lap: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(200))
    provider: Mapped[str | None] = mapped_column(String(200))
    at: Mapped[datetime]
    tokens: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_rate_charges_at", "at"),)


__all__ = ["ProviderPauseRow", "RateChargeRow", "ShareLimitRow"]
