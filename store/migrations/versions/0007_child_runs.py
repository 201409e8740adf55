"""child runs: which call of which parent started a run

Revision ID: 0007_child_runs
Revises: 0002_served_versions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007_child_runs'
down_revision = '0006_stream_trace'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('child_runs',
    sa.Column('child_run_id', sa.String(length=200), nullable=False),
    sa.Column('parent_run_id', sa.String(length=200), nullable=False),
    sa.Column('group_key', sa.String(length=300), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('depth', sa.Integer(), nullable=False),
    sa.Column('principal', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('child_run_id', name=op.f('pk_child_runs'))
    )
    op.create_index('ix_child_runs_group', 'child_runs', ['group_key', 'position'],
                    unique=False)
    op.create_index('ix_child_runs_parent', 'child_runs', ['parent_run_id'], unique=False)
    # list_runs(parent=...) and the tree in `runs show`
    op.create_index('ix_runs_parent', 'runs', ['parent_run_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_runs_parent', table_name='runs')
    op.drop_index('ix_child_runs_parent', table_name='child_runs')
    op.drop_index('ix_child_runs_group', table_name='child_runs')
    op.drop_table('child_runs')
