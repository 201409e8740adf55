"""rate limits: laps and tokens per minute per tenant, and the charges log

Revision ID: 0013_rate_limits
Revises: 0010_tenant_tables

Two columns on ``share_limits`` (a tenant's laps and model tokens per minute)
and ``rate_charges``, the sliding-window log admission charges each admitted
lap to (``store.ratelimit``). Like ``provider_pauses`` it is the fleet's
accounting, read across tenants by admission, so it stays outside row-level
security.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013_rate_limits'
down_revision = '0010_tenant_tables'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('share_limits', sa.Column('laps_per_minute', sa.Integer(), nullable=True))
    op.add_column('share_limits', sa.Column('tokens_per_minute', sa.BigInteger(),
                                            nullable=True))
    op.create_table('rate_charges',
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('lap', sa.Integer(), nullable=False),
    sa.Column('tenant', sa.String(length=200), nullable=False),
    sa.Column('provider', sa.String(length=200), nullable=True),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'lap', name=op.f('pk_rate_charges'))
    )
    op.create_index('ix_rate_charges_at', 'rate_charges', ['at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_rate_charges_at', table_name='rate_charges')
    op.drop_table('rate_charges')
    op.drop_column('share_limits', 'tokens_per_minute')
    op.drop_column('share_limits', 'laps_per_minute')
