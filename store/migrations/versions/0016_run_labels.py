"""run labels: a side table a label search walks in listing order under row-level security

Revision ID: 0016_run_labels
Revises: 0015_scale_indexes

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

The policy of ``run_labels`` has the same shape on its own ``tenant`` column,
and the table is ``FORCE``d like every tenant-owned table. Its rows are
written by a trigger on ``runs`` (``AFTER INSERT``, in the inserting
statement's transaction), not by the store's code: every path that inserts a
run with labels is covered, including code older than this revision still
running during a rolling deploy (its runs would otherwise never be found by
label). Labels are set once, by ``start_run``; no verb changes a run's labels
or tenant afterwards.

Order, for a live fleet (one transaction; each lock is held to the commit):
the table, its backfill and its indexes first (reading ``runs`` blocks no
lap); then the trigger, whose lock on ``runs`` holds every write to it (lap
commits included) until the commit, and a second pass that copies the labels
of runs committed since the first pass read the table (seconds at a million
runs: one scan of ``runs`` against ``run_labels``); then the policy and the
GIN index. ``tests/store/test_label_migration.py`` plays a 0015 process
inserting a run between the two passes. The downgrade drops the table and the trigger and puts back
the GIN index and the policy of ``0003_tenancy``.
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

#: Copies every run's labels that are not copied yet (the second pass finds
#: only runs committed while the first ran).
BACKFILL = {
    "postgresql": "INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
                  "SELECT r.id, l.key, l.value, r.tenant, r.created_at "
                  "FROM runs r CROSS JOIN LATERAL jsonb_each_text(r.labels) l "
                  "WHERE r.labels IS NOT NULL AND jsonb_typeof(r.labels) = 'object' "
                  "AND NOT EXISTS (SELECT 1 FROM run_labels x WHERE x.run_id = r.id)",
    "sqlite": "INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
              "SELECT r.id, j.key, j.value, r.tenant, r.created_at "
              "FROM runs r, json_each(r.labels) j "
              "WHERE r.labels IS NOT NULL AND json_type(r.labels) = 'object' "
              "AND NOT EXISTS (SELECT 1 FROM run_labels x WHERE x.run_id = r.id)",
}
TRIGGER = "run_labels_from_run"
PG_FUNCTION = f"""
CREATE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_labels (run_id, key, value, tenant, created_at)
    SELECT NEW.id, l.key, l.value, NEW.tenant, NEW.created_at
    FROM jsonb_each_text(NEW.labels) l;
    RETURN NULL;
END $$;
"""
PG_TRIGGER = (f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON runs FOR EACH ROW "
              "WHEN (NEW.labels IS NOT NULL AND jsonb_typeof(NEW.labels) = 'object') "
              f"EXECUTE FUNCTION {TRIGGER}()")
SQLITE_TRIGGER = (
    f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON runs FOR EACH ROW "
    "WHEN NEW.labels IS NOT NULL AND json_type(NEW.labels) = 'object' BEGIN "
    "INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
    "SELECT NEW.id, j.key, j.value, NEW.tenant, NEW.created_at "
    "FROM json_each(NEW.labels) j; END")


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
    postgres = op.get_bind().dialect.name == "postgresql"
    backfill = BACKFILL["postgresql" if postgres else "sqlite"]
    if postgres:
        # The backfill reads every tenant's runs through runs' forced policy.
        op.execute("SELECT set_config('agent_worker.tenant', '*', true)")
        op.execute("ALTER TABLE run_labels ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE run_labels FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_scope ON run_labels USING ({POLICY})")
        op.execute("SET LOCAL maintenance_work_mem = '256MB'")
    op.execute(backfill)
    op.create_index('ix_run_labels_pair', 'run_labels',
                    ['key', 'value', 'created_at', 'run_id'], unique=False)
    op.create_index('ix_run_labels_tenant', 'run_labels',
                    ['tenant', 'key', 'value', 'created_at', 'run_id'], unique=False)
    if postgres:
        op.execute("ANALYZE run_labels")
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
        op.execute(backfill)  # runs committed while the first pass read the table
        op.execute(f"ALTER POLICY tenant_scope ON runs USING ({POLICY})")
    else:
        op.execute(SQLITE_TRIGGER)
    op.drop_index('ix_runs_labels', table_name='runs')


def downgrade() -> None:
    op.execute(f"DROP TRIGGER {TRIGGER}" + (" ON runs" if op.get_bind().dialect.name
                                            == "postgresql" else ""))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {TRIGGER}()")
        op.execute(f"ALTER POLICY tenant_scope ON runs USING ({OLD_RUNS_POLICY})")
    op.create_index('ix_runs_labels', 'runs', ['labels'], unique=False,
                    postgresql_using='gin', postgresql_ops={'labels': 'jsonb_path_ops'})
    op.drop_index('ix_run_labels_tenant', table_name='run_labels')
    op.drop_index('ix_run_labels_pair', table_name='run_labels')
    op.drop_table('run_labels')  # its policy goes with it
