"""The tables behind the metrics scrape's run totals (migration
``0017_metrics_rollup``; read and folded by ``store.rollup``)."""

from __future__ import annotations

from typing import cast

from sqlalchemy import BigInteger, Index, Integer, String, Table, text
from sqlalchemy.orm import Mapped, mapped_column

from agent_worker.store.modelbase import Base
from agent_worker.store.models import ApprovalRow

_PENDING = text("status = 'pending'")
_approvals = cast(Table, ApprovalRow.__table__)
#: The scrape's pending-approval count and oldest request walk only pending ones.
Index("ix_approvals_pending", _approvals.c.requested_at, _approvals.c.run_id,
      postgresql_where=_PENDING, sqlite_where=_PENDING)


class RunTotalsRow(Base):
    """Totals of the settled runs (every status but queued and running) of one
    agent in one status, as of the last fold (``store.rollup``): the metrics
    scrape reads these instead of the run table. Written only by the fold."""

    __tablename__ = "run_totals"

    agent_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    runs: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    recoveries: Mapped[int] = mapped_column(BigInteger)


class RunTotalDeltaRow(Base):
    """One change to ``run_totals`` not folded yet, appended by the triggers
    of migration ``0017_metrics_rollup`` when a run enters (+1), leaves (-1)
    or changes within a settled status. Append-only until folded, so no lap
    and no ending ever updates a shared row."""

    __tablename__ = "run_total_deltas"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    agent_name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20))
    runs: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    recoveries: Mapped[int] = mapped_column(BigInteger)


class ApprovalTotalsRow(Base):
    """How many approvals are in each status, as of the last fold
    (``store.rollup``): the scrape's pending count reads this instead of the
    approvals, whose pending ones are as many as humans leave undecided.
    Written only by the fold."""

    __tablename__ = "approval_totals"

    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    approvals: Mapped[int] = mapped_column(BigInteger)


class ApprovalTotalDeltaRow(Base):
    """One change to ``approval_totals`` not folded yet, appended by the
    triggers of migration ``0020_approval_totals`` when an approval is
    requested (+1), decided or timed out (-1 from pending, +1 to its
    outcome) or deleted (-1)."""

    __tablename__ = "approval_total_deltas"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    status: Mapped[str] = mapped_column(String(20))
    approvals: Mapped[int] = mapped_column(BigInteger)
