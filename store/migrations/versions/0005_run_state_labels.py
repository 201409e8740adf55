"""run state and labels: run labels (jsonb + GIN on Postgres), a created_at
index for paged listing, operator state edits, approvals with edited arguments

Revision ID: 0005_run_state_labels
Revises: 0002_served_versions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0005_run_state_labels'
down_revision = '0004_fair_share'
branch_labels = None
depends_on = None

_LABELS = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    # Nullable with no default: adding it rewrites nothing on a large runs table.
    op.add_column('runs', sa.Column('labels', _LABELS, nullable=True))
    # jsonb_path_ops: the smaller, faster GIN for `labels @> '{"k": "v"}'`,
    # the only operator the store uses on labels (BENCHMARKS.md, labels).
    op.create_index('ix_runs_labels', 'runs', ['labels'], unique=False,
                    postgresql_using='gin', postgresql_ops={'labels': 'jsonb_path_ops'})
    op.create_index('ix_runs_created', 'runs', ['created_at', 'id'], unique=False)
    op.create_table('state_edits',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
              autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('edit', sa.JSON(), nullable=False),
    sa.Column('requested_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('applied_lap', sa.Integer(), nullable=True),
    sa.Column('dropped_lap', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_state_edits'))
    )
    op.create_index('ix_state_edits_run', 'state_edits', ['run_id', 'applied_lap'],
                    unique=False)
    op.add_column('approvals', sa.Column('approved_arguments', sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column('approvals', 'approved_arguments')
    op.drop_index('ix_state_edits_run', table_name='state_edits')
    op.drop_table('state_edits')
    op.drop_index('ix_runs_created', table_name='runs')
    op.drop_index('ix_runs_labels', table_name='runs')
    op.drop_column('runs', 'labels')
