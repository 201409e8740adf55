"""Run labels as rows (migration ``0016_run_labels``): one per label of a run,
so that a label search is a b-tree walk in listing order, which row-level
security allows (``jsonb @>`` is not leakproof: under the forced policy its
GIN index was never used, BENCHMARKS.md "Listings under row-level security at
a million runs").

``runs.labels`` stays what a run shows; this table is only what a search
walks. Both are written by the one transaction that inserts the run
(``store.runinsert.create_run_tx``): labels are set once, at ``start_run``,
and no verb changes a run's labels or tenant afterwards. ``tenant`` and
``created_at`` are the run's, copied so the table's own policy and the
listing's order need no join.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Index, String, Table, insert
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


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


def insert_labels_tx(conn: Connection, *, run_id: str, tenant: str | None,
                     created_at: datetime, labels: Mapping[str, str] | None) -> None:
    """Insert the rows of a new run's ``labels`` (already checked by
    ``steering.check_labels``); never commits: the caller's transaction also
    inserts the run, so a run is never found without its labels or a label
    without its run."""
    if labels:
        conn.execute(insert(run_labels), [
            {"run_id": run_id, "key": k, "value": v, "tenant": tenant,
             "created_at": created_at} for k, v in labels.items()])


__all__ = ["RunLabelRow", "insert_labels_tx", "run_labels"]
