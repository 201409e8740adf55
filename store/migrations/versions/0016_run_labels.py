"""run labels: a side table a label search walks in listing order under row-level security

Revision ID: 0016_run_labels
Revises: 0015_scale_indexes
Create Date: 2026-12-01

Why (BENCHMARKS.md, "Listings under row-level security at a million runs"):

* ``jsonb @>`` is not leakproof, so under the forced policy of
  ``0003_tenancy`` Postgres never lets it be an index condition: a label
  search was a parallel sequential scan of ``runs`` (1.4-1.8 s at 1.11 M
  runs), and the GIN index ``ix_runs_labels`` was never used. ``run_labels``
  holds one row per label of a run (tenant, key, value, run_id, created_at);
  its b-tree indexes compare text and timestamps only, whose operators are
  leakproof, so a search walks ``(key, value, created_at, run_id)`` (or the
  same after ``tenant``) newest first and stops after a page. The GIN index
  goes: nothing reads it any more, and every non-HOT update of a run row
  (a lap's) paid an entry in it.
* The policy's ``current_setting(...) = '*'`` arm has no column, so the
  planner gave it the default 0.5 % and, multiplied by the query's own
  ``tenant =`` filter, believed a tenant's commonest status matched almost
  nothing: it read every match through a bitmap and sorted them rather than
  walk an index that stops after a page. The arm is rewritten as
  ``COALESCE(... = '*', false)``, which means the same (``NULL`` was already
  "not visible") but is estimated at one half: the ordered walk wins again.
  The tenant arm is unchanged.

The policy of ``run_labels`` has the same shape on its own ``tenant`` column
(copied from the run in the transaction that inserts it: labels are set once,
by ``start_run``, and neither a run's labels nor its tenant change after), and
the table is ``FORCE``d like every tenant-owned table. The upgrade copies every
run's labels into it; the downgrade drops it and puts back the GIN index and
the policy of ``0003_tenancy``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016_run_labels'
down_revision = '0015_scale_indexes'
branch_labels = None
depends_on = None

SCOPE = "current_setting('agent_worker.tenant', true)"
#: The policy of ``0003_tenancy`` on ``runs`` (restored by the downgrade).
OLD_RUNS_POLICY = f"{SCOPE} = '*' OR tenant = {SCOPE}"
#: The same rows, with the system arm estimated at one half (see above).
POLICY = f"COALESCE({SCOPE} = '*', false) OR tenant = {SCOPE}"

BACKFILL = {
    "postgresql": "INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
                  "SELECT r.id, l.key, l.value, r.tenant, r.created_at "
                  "FROM runs r CROSS JOIN LATERAL jsonb_each_text(r.labels) l "
                  "WHERE r.labels IS NOT NULL AND jsonb_typeof(r.labels) = 'object'",
    "sqlite": "INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
              "SELECT r.id, j.key, j.value, r.tenant, r.created_at "
              "FROM runs r, json_each(r.labels) j "
              "WHERE r.labels IS NOT NULL AND json_type(r.labels) = 'object'",
}


def upgrade() -> None:
    op.create_table(
        'run_labels',
        sa.Column('run_id', sa.String(length=200), nullable=False),
        sa.Column('key', sa.String(length=200), nullable=False),
        sa.Column('value', sa.String(length=200), nullable=False),
        sa.Column('tenant', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'key', name=op.f('pk_run_labels')),
    )
    op.create_index('ix_run_labels_pair', 'run_labels',
                    ['key', 'value', 'created_at', 'run_id'], unique=False)
    op.create_index('ix_run_labels_tenant', 'run_labels',
                    ['tenant', 'key', 'value', 'created_at', 'run_id'], unique=False)
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        # The backfill reads every tenant's runs through runs' forced policy.
        op.execute("SELECT set_config('agent_worker.tenant', '*', true)")
        op.execute("ALTER TABLE run_labels ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE run_labels FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_scope ON run_labels USING ({POLICY})")
        op.execute(f"ALTER POLICY tenant_scope ON runs USING ({POLICY})")
    op.execute(BACKFILL.get(dialect, BACKFILL["sqlite"]))
    if dialect == "postgresql":
        op.execute("ANALYZE run_labels")
    op.drop_index('ix_runs_labels', table_name='runs')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER POLICY tenant_scope ON runs USING ({OLD_RUNS_POLICY})")
    op.create_index('ix_runs_labels', 'runs', ['labels'], unique=False,
                    postgresql_using='gin', postgresql_ops={'labels': 'jsonb_path_ops'})
    op.drop_index('ix_run_labels_tenant', table_name='run_labels')
    op.drop_index('ix_run_labels_pair', table_name='run_labels')
    op.drop_table('run_labels')  # its policy goes with it
