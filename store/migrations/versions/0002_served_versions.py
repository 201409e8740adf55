"""served versions: worker heartbeats per agent version

Revision ID: 0002_served_versions
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002_served_versions'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('served_versions',
    sa.Column('worker', sa.String(length=300), nullable=False),
    sa.Column('agent_name', sa.String(length=200), nullable=False),
    sa.Column('agent_version', sa.String(length=50), nullable=False),
    sa.Column('seen_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('worker', 'agent_name', 'agent_version',
                            name=op.f('pk_served_versions'))
    )
    op.create_index('ix_served_versions_agent', 'served_versions',
                    ['agent_name', 'agent_version', 'seen_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_served_versions_agent', table_name='served_versions')
    op.drop_table('served_versions')
