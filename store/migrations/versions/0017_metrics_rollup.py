"""metrics rollup: settled runs' totals kept by triggers, so a scrape reads no run table

Revision ID: 0017_metrics_rollup
Revises: 0015_scale_indexes

Why (BENCHMARKS.md, "Costs at a million runs"): the scrape grouped every run
row by agent and status with four sums, 2.9 s at 1.11 M runs. Now:

* Runs in the workers' hands (``queued``, ``running``: few) are still counted
  from their rows, through the status indexes.
* Every other run (``waiting``, ``sleeping``, ``succeeded``, ``failed``,
  ``cancelled``: "settled") is counted in ``run_totals`` (agent, status) plus
  the not yet folded rows of ``run_total_deltas``. Triggers on ``runs`` append
  a delta row (+1 and the row's sums for the state it enters, -1 and the old
  sums for the state it leaves) whenever a row enters, leaves or changes while
  in a settled status. A lap of a running run matches neither (its trigger's
  ``WHEN`` is false, nothing is queued), so a lap pays nothing and no lap
  updates a shared row: each ending inserts its own delta rows.
* Whoever reads the totals folds the deltas into ``run_totals`` (``DELETE ...
  RETURNING`` then an upsert, one transaction: a delta row is folded exactly
  once, whatever commits late or concurrently, store/rollup.py).
* ``ix_approvals_pending``: the pending-approval count and the oldest request
  walk only pending approvals.

Backfill: the triggers are created first (that takes a lock on ``runs`` that
waits for in-flight writers and holds off new ones until this migration
commits), then ``run_totals`` is filled from one grouped pass over the settled
runs: every change before the lock is in that pass, every change after it is a
delta row. Downgrade drops the triggers, the two tables and the index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017_metrics_rollup'
down_revision = '0016_run_labels'
branch_labels = None
depends_on = None

LIVE = "('queued', 'running')"
SUMS = ("cost_micros", "input_tokens", "output_tokens", "recoveries")
CHANGED = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}"
                      for c in ("status", "agent_name", *SUMS))

PG_FUNCTION = f"""
CREATE FUNCTION run_totals_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.status NOT IN {LIVE} THEN
        INSERT INTO run_total_deltas (agent_name, status, runs, {', '.join(SUMS)})
        VALUES (OLD.agent_name, OLD.status, -1, {', '.join(f'-OLD.{c}' for c in SUMS)});
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.status NOT IN {LIVE} THEN
        INSERT INTO run_total_deltas (agent_name, status, runs, {', '.join(SUMS)})
        VALUES (NEW.agent_name, NEW.status, 1, {', '.join(f'NEW.{c}' for c in SUMS)});
    END IF;
    RETURN NULL;
END $$
"""

PG_TRIGGERS = (
    "CREATE TRIGGER run_totals_insert AFTER INSERT ON runs FOR EACH ROW "
    f"WHEN (NEW.status NOT IN {LIVE}) EXECUTE FUNCTION run_totals_delta()",
    "CREATE TRIGGER run_totals_update AFTER UPDATE ON runs FOR EACH ROW "
    f"WHEN ((OLD.status NOT IN {LIVE} OR NEW.status NOT IN {LIVE}) AND ({CHANGED})) "
    "EXECUTE FUNCTION run_totals_delta()",
    "CREATE TRIGGER run_totals_delete AFTER DELETE ON runs FOR EACH ROW "
    f"WHEN (OLD.status NOT IN {LIVE}) EXECUTE FUNCTION run_totals_delta()",
    # TRUNCATE fires no row trigger: empty the totals with the table.
    "CREATE FUNCTION run_totals_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN DELETE FROM run_totals; DELETE FROM run_total_deltas; RETURN NULL; END $$",
    "CREATE TRIGGER run_totals_truncate AFTER TRUNCATE ON runs FOR EACH STATEMENT "
    "EXECUTE FUNCTION run_totals_truncate()",
)


def _sqlite_insert(row: str) -> str:
    sign = "-" if row == "OLD" else ""
    return (f"INSERT INTO run_total_deltas (agent_name, status, runs, {', '.join(SUMS)}) "
            f"SELECT {row}.agent_name, {row}.status, {sign}1, "
            f"{', '.join(f'{sign}{row}.{c}' for c in SUMS)} "
            f"WHERE {row}.status NOT IN {LIVE};")


SQLITE_TRIGGERS = (
    f"CREATE TRIGGER run_totals_insert AFTER INSERT ON runs WHEN NEW.status NOT IN {LIVE} "
    f"BEGIN {_sqlite_insert('NEW')} END",
    "CREATE TRIGGER run_totals_update AFTER UPDATE ON runs "
    f"WHEN (OLD.status NOT IN {LIVE} OR NEW.status NOT IN {LIVE}) AND ({CHANGED}) "
    f"BEGIN {_sqlite_insert('OLD')} {_sqlite_insert('NEW')} END",
    f"CREATE TRIGGER run_totals_delete AFTER DELETE ON runs WHEN OLD.status NOT IN {LIVE} "
    f"BEGIN {_sqlite_insert('OLD')} END",
)

BACKFILL = f"""
INSERT INTO run_totals (agent_name, status, runs, {', '.join(SUMS)})
SELECT agent_name, status, count(*), {', '.join(f'coalesce(sum({c}), 0)' for c in SUMS)}
FROM runs WHERE status NOT IN {LIVE} GROUP BY agent_name, status
"""


def _sums() -> list[sa.Column[int]]:
    return [sa.Column(c, sa.BigInteger(), nullable=False) for c in ("runs", *SUMS)]


def upgrade() -> None:
    op.create_table(
        'run_totals',
        sa.Column('agent_name', sa.String(length=200), nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        *_sums(),
        sa.PrimaryKeyConstraint('agent_name', 'status', name=op.f('pk_run_totals')))
    op.create_table(
        'run_total_deltas',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                  autoincrement=True, nullable=False),
        sa.Column('agent_name', sa.String(length=200), nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        *_sums(),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_run_total_deltas')))
    where = sa.text("status = 'pending'")
    op.create_index('ix_approvals_pending', 'approvals', ['requested_at', 'run_id'],
                    unique=False, postgresql_where=where, sqlite_where=where)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for ddl in PG_TRIGGERS:
            op.execute(ddl)
        # Every tenant's runs, whatever connection runs the migration (the
        # forced tenancy policy would otherwise hide them from the backfill).
        op.execute("SELECT set_config('agent_worker.tenant', '*', true)")
    else:
        for ddl in SQLITE_TRIGGERS:
            op.execute(ddl)
    op.execute(BACKFILL)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in ("run_totals_insert", "run_totals_update", "run_totals_delete",
                 *(("run_totals_truncate",) if postgres else ())):
        op.execute(f"DROP TRIGGER {name} ON runs" if postgres else f"DROP TRIGGER {name}")
    if postgres:
        op.execute("DROP FUNCTION run_totals_truncate()")
        op.execute("DROP FUNCTION run_totals_delta()")
    op.drop_index('ix_approvals_pending', table_name='approvals')
    op.drop_table('run_total_deltas')
    op.drop_table('run_totals')
