"""approval totals: the pending-approval count kept by triggers, so a scrape reads no approval rows

Revision ID: 0020_approval_totals
Revises: 0019_waiting_line

Why (BENCHMARKS.md, "The metrics scrape at a million runs"): after
``0017_metrics_rollup`` the scrape's pending-approval count was its one read
that grew with undecided work rather than live runs: a count over every
pending approval (50,000 in the seeded database: a sequential scan, 11-25 ms
at load 1-3, 100-270 ms at load 14-24; under the tenancy policy the planner
never counts them from ``ix_approvals_pending`` alone). Now, as for the run
totals:

* ``approval_totals`` (status) holds how many approvals are in each status as
  of the last fold; triggers on ``approvals`` append a row to
  ``approval_total_deltas`` for every change: +1 for the status a row enters
  (insert, or an update that changes the status), -1 for the one it leaves
  (that update, or a delete). A decision is one update, so two delta rows;
  nothing else an approval does changes its status.
* The scrape's fold (``store.rollup.fold``) folds these deltas in the same
  transaction and under the same advisory lock as the run deltas, and the
  count adds any delta not folded yet: exact at the statement's snapshot.
* The oldest pending request stays a read of ``ix_approvals_pending``: its
  first entry (``min()`` over an index ordered by ``requested_at``), one row
  however many are pending.

Backfill: the triggers are created first (that locks ``approvals`` against
writers until this migration commits), then ``approval_totals`` is filled
from one grouped pass over the approvals: every change before the lock is in
that pass, every change after it is a delta row. Downgrade drops the
triggers and the two tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020_approval_totals'
down_revision = '0019_waiting_line'
branch_labels = None
depends_on = None

INSERT_DELTA = "INSERT INTO approval_total_deltas (status, approvals) VALUES ({row}.status, {n})"

PG_FUNCTION = f"""
CREATE FUNCTION approval_totals_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        {INSERT_DELTA.format(row='OLD', n=-1)};
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        {INSERT_DELTA.format(row='NEW', n=1)};
    END IF;
    RETURN NULL;
END $$
"""

CHANGED = "OLD.status IS DISTINCT FROM NEW.status"

PG_TRIGGERS = (
    "CREATE TRIGGER approval_totals_insert AFTER INSERT ON approvals FOR EACH ROW "
    "EXECUTE FUNCTION approval_totals_delta()",
    f"CREATE TRIGGER approval_totals_update AFTER UPDATE ON approvals FOR EACH ROW "
    f"WHEN ({CHANGED}) EXECUTE FUNCTION approval_totals_delta()",
    "CREATE TRIGGER approval_totals_delete AFTER DELETE ON approvals FOR EACH ROW "
    "EXECUTE FUNCTION approval_totals_delta()",
    # TRUNCATE fires no row trigger: empty the totals with the table.
    "CREATE FUNCTION approval_totals_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN DELETE FROM approval_totals; DELETE FROM approval_total_deltas; RETURN NULL; END $$",
    "CREATE TRIGGER approval_totals_truncate AFTER TRUNCATE ON approvals FOR EACH STATEMENT "
    "EXECUTE FUNCTION approval_totals_truncate()",
)

SQLITE_TRIGGERS = (
    "CREATE TRIGGER approval_totals_insert AFTER INSERT ON approvals "
    f"BEGIN {INSERT_DELTA.format(row='NEW', n=1)}; END",
    f"CREATE TRIGGER approval_totals_update AFTER UPDATE ON approvals WHEN {CHANGED} "
    f"BEGIN {INSERT_DELTA.format(row='OLD', n=-1)}; {INSERT_DELTA.format(row='NEW', n=1)}; END",
    "CREATE TRIGGER approval_totals_delete AFTER DELETE ON approvals "
    f"BEGIN {INSERT_DELTA.format(row='OLD', n=-1)}; END",
)

BACKFILL = ("INSERT INTO approval_totals (status, approvals) "
            "SELECT status, count(*) FROM approvals GROUP BY status")


def upgrade() -> None:
    op.create_table(
        'approval_totals',
        sa.Column('status', sa.String(length=20), nullable=False),
        sa.Column('approvals', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('status', name=op.f('pk_approval_totals')))
    op.create_table(
        'approval_total_deltas',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  autoincrement=True, nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        sa.Column('approvals', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_approval_total_deltas')))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for ddl in PG_TRIGGERS:
            op.execute(ddl)
        # Every tenant's approvals, whatever connection runs the migration (the
        # forced tenancy policy would otherwise hide them from the backfill).
        op.execute("SELECT set_config('agent_worker.tenant', '*', true)")
    else:
        for ddl in SQLITE_TRIGGERS:
            op.execute(ddl)
    op.execute(BACKFILL)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in ("approval_totals_insert", "approval_totals_update", "approval_totals_delete",
                 *(("approval_totals_truncate",) if postgres else ())):
        op.execute(f"DROP TRIGGER {name} ON approvals" if postgres else f"DROP TRIGGER {name}")
    if postgres:
        op.execute("DROP FUNCTION approval_totals_truncate()")
        op.execute("DROP FUNCTION approval_totals_delta()")
    op.drop_table('approval_total_deltas')
    op.drop_table('approval_totals')
