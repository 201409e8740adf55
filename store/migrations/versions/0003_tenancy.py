"""tenancy: the audit log, append-only; row-level security on tenant-owned tables

Revision ID: 0003_tenancy
Revises: 0002_served_versions

Row-level security (Postgres only): a row is visible when the setting
``agent_worker.tenant`` is ``*`` (our processes' system scope) or the row's
tenant; a child row (checkpoint, message, effect, event, approval, signal)
when its run is visible, so no child table needs a tenant column and the lap's
inserts are unchanged. FORCE: the app role owns these tables and would
otherwise bypass its own policies. See ``store/tenancy.py``.

The audit log is append-only for the app role: a trigger refuses UPDATE and
TRUNCATE always, and DELETE except of rows older than the cutoff the retention
prune declares for its own transaction (``agent_worker.audit_prune_before``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003_tenancy'
down_revision = '0002_served_versions'
branch_labels = None
depends_on = None

SCOPE = "current_setting('agent_worker.tenant', true)"
CHILDREN = ("checkpoints", "messages", "effects", "events", "approvals", "signals")

APPEND_ONLY = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cutoff text := current_setting('agent_worker.audit_prune_before', true);
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(cutoff, '') <> '' THEN
        IF OLD.at < cutoff::timestamp THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
"""


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True,
              nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('tenant', sa.String(length=200), nullable=True),
    sa.Column('principal', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=50), nullable=False),
    sa.Column('outcome', sa.String(length=20), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=True),
    sa.Column('target', sa.String(length=300), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('changes', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    op.create_index('ix_audit_log_tenant', 'audit_log', ['tenant', 'id'], unique=False)
    op.create_index('ix_audit_log_run', 'audit_log', ['run_id', 'id'], unique=False)
    op.create_index('ix_audit_log_at', 'audit_log', ['at'], unique=False)
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, visible in [("runs", f"tenant = {SCOPE}"), ("audit_log", f"tenant = {SCOPE}"),
                           *[(t, "EXISTS (SELECT 1 FROM runs r WHERE r.id = run_id)")
                             for t in CHILDREN]]:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_scope ON {table} "
                   f"USING ({SCOPE} = '*' OR {visible})")
    op.execute(APPEND_ONLY)
    op.execute("CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
               "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()")
    op.execute("CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
               "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in ("runs", *CHILDREN):
            op.execute(f"DROP POLICY tenant_scope ON {table}")
            op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.drop_index('ix_audit_log_at', table_name='audit_log')
    op.drop_index('ix_audit_log_run', table_name='audit_log')
    op.drop_index('ix_audit_log_tenant', table_name='audit_log')
    op.drop_table('audit_log')
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION audit_log_append_only()")
