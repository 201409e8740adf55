"""schedules: durable cron schedules

Revision ID: 0009_schedules
Revises: 0002_served_versions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009_schedules'
down_revision = '0007_child_runs'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('schedules',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('tenant', sa.String(length=200), nullable=True),
    sa.Column('agent_name', sa.String(length=200), nullable=False),
    sa.Column('agent_version', sa.String(length=50), nullable=True),
    sa.Column('cron', sa.String(length=200), nullable=False),
    sa.Column('timezone', sa.String(length=200), nullable=False),
    sa.Column('input', sa.JSON(), nullable=True),
    sa.Column('catchup', sa.String(length=10), nullable=False),
    sa.Column('catchup_limit', sa.Integer(), nullable=False),
    sa.Column('overlap', sa.String(length=10), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('next_fire_at', sa.DateTime(), nullable=False),
    sa.Column('last_fire_at', sa.DateTime(), nullable=True),
    sa.Column('last_run_id', sa.String(length=200), nullable=True),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_schedules'))
    )
    op.create_index(op.f('ix_schedules_tenant'), 'schedules', ['tenant'], unique=False)
    op.create_index('ix_schedules_due', 'schedules', ['paused', 'next_fire_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_schedules_due', table_name='schedules')
    op.drop_index(op.f('ix_schedules_tenant'), table_name='schedules')
    op.drop_table('schedules')
