"""Run labels as rows (migration ``0016_run_labels``): one per label of a run,
so that a label search is a b-tree walk in listing order, which row-level
security allows (``jsonb @>`` is not leakproof: under the forced policy its
GIN index was never used, BENCHMARKS.md "Listings under row-level security at
a million runs").

``runs.labels`` stays what a run shows; this table is only what a search
walks. Its rows are written by the trigger ``run_labels_from_run`` on
``runs`` (``AFTER INSERT``, in the same transaction as the run: see the
migration for why a trigger and not this code), so a run is never found
without its labels, nor a label without its run. ``tenant`` and
``created_at`` are the run's, copied so the table's own policy and the
listing's order need no join; labels are set once, at ``start_run``, and no
verb changes a run's labels or tenant afterwards.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Index, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from agent_worker.store.modelbase import Base


class RunLabelRow(Base):
    """One label of one run: ``(key, value)`` of ``runs.labels``."""

    __tablename__ = "run_labels"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
    tenant: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]

    __table_args__ = (
        # Every label's runs newest first, across tenants (the system scope)...
        Index("ix_run_labels_pair", "key", "value", "created_at", "run_id"),
        # ...and within one tenant (a principal's search).
        Index("ix_run_labels_tenant", "tenant", "key", "value", "created_at", "run_id"),
    )


run_labels = cast(Table, RunLabelRow.__table__)


__all__ = ["RunLabelRow", "run_labels"]
