"""tenancy for the tables added beside it: state edits, child runs, schedules

Revision ID: 0010_tenant_tables
Revises: 0009_schedules

The same row-level security as ``0003_tenancy`` for the tenant-owned tables
that landed after it: an operator's state edit and a child
run's link row are visible when their run is; a schedule when its tenant is
the transaction's. Fair-share limits and provider pauses are the fleet's
configuration, not a tenant's data, and stay outside it.
"""

from __future__ import annotations

from alembic import op

revision = '0010_tenant_tables'
down_revision = '0009_schedules'
branch_labels = None
depends_on = None

SCOPE = "current_setting('agent_worker.tenant', true)"
POLICIES = {
    "state_edits": "EXISTS (SELECT 1 FROM runs r WHERE r.id = run_id)",
    "child_runs": "EXISTS (SELECT 1 FROM runs r WHERE r.id = child_run_id)",
    "schedules": f"tenant = {SCOPE}",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, visible in POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_scope ON {table} "
                   f"USING ({SCOPE} = '*' OR {visible})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in POLICIES:
        op.execute(f"DROP POLICY tenant_scope ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
