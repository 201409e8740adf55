"""fair share: run priority and admission, per-tenant limits, provider pauses

Revision ID: 0004_fair_share
Revises: 0002_served_versions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004_fair_share'
down_revision = '0003_tenancy'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('priority', sa.Integer(), server_default='0',
                                    nullable=False))
    op.add_column('runs', sa.Column('admitted_lap', sa.Integer(), nullable=True))
    op.create_index('ix_runs_admission', 'runs',
                    ['status', 'admitted_lap', 'tenant', 'priority', 'created_at'], unique=False)
    op.create_table('share_limits',
    sa.Column('tenant', sa.String(length=200), nullable=False),
    sa.Column('agent', sa.String(length=200), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=True),
    sa.Column('weight', sa.Float(), nullable=True),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=200), nullable=True),
    sa.PrimaryKeyConstraint('tenant', 'agent', name=op.f('pk_share_limits'))
    )
    op.create_table('provider_pauses',
    sa.Column('provider', sa.String(length=200), nullable=False),
    sa.Column('until', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('provider', name=op.f('pk_provider_pauses'))
    )


def downgrade() -> None:
    op.drop_table('provider_pauses')
    op.drop_table('share_limits')
    op.drop_index('ix_runs_admission', table_name='runs')
    op.drop_column('runs', 'admitted_lap')
    op.drop_column('runs', 'priority')
