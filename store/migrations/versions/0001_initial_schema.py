"""initial schema

Revision ID: 0001
Revises: 
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('approvals',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('effect_key', sa.String(length=300), nullable=False),
    sa.Column('tool_name', sa.String(length=200), nullable=False),
    sa.Column('arguments', sa.JSON(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('owner', sa.String(length=200), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('on_timeout', sa.String(length=20), nullable=False),
    sa.Column('escalate_to', sa.String(length=200), nullable=True),
    sa.Column('requested_at', sa.DateTime(), nullable=False),
    sa.Column('timeout_at', sa.DateTime(), nullable=True),
    sa.Column('decided_by', sa.String(length=200), nullable=True),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('decided_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_approvals')),
    sa.UniqueConstraint('effect_key', name=op.f('uq_approvals_effect_key'))
    )
    op.create_index(op.f('ix_approvals_run_id'), 'approvals', ['run_id'], unique=False)
    op.create_index('ix_approvals_status', 'approvals', ['status', 'timeout_at'], unique=False)
    op.create_table('checkpoints',
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('lap', sa.Integer(), nullable=False),
    sa.Column('schema_version', sa.Integer(), nullable=False),
    sa.Column('state', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'lap', name=op.f('pk_checkpoints'))
    )
    op.create_table('effects',
    sa.Column('key', sa.String(length=300), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('lap', sa.Integer(), nullable=False),
    sa.Column('call_index', sa.Integer(), nullable=False),
    sa.Column('tool_name', sa.String(length=200), nullable=False),
    sa.Column('tool_version', sa.String(length=50), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('args_hash', sa.String(length=64), nullable=False),
    sa.Column('args', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('compensates', sa.String(length=300), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_effects'))
    )
    op.create_index('ix_effects_run_lap', 'effects', ['run_id', 'lap'], unique=False)
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('lap', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=50), nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    op.create_index('ix_events_run', 'events', ['run_id', 'id'], unique=False)
    op.create_table('messages',
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('lap', sa.Integer(), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'seq', name=op.f('pk_messages'))
    )
    op.create_table('runs',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('tenant', sa.String(length=200), nullable=True),
    sa.Column('agent_name', sa.String(length=200), nullable=False),
    sa.Column('agent_version', sa.String(length=50), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('next_lap', sa.Integer(), nullable=False),
    sa.Column('lap_attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(), nullable=True),
    sa.Column('wake_at', sa.DateTime(), nullable=True),
    sa.Column('enqueued_at', sa.DateTime(), nullable=True),
    sa.Column('waiting_for', sa.String(length=300), nullable=True),
    sa.Column('input', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error_code', sa.String(length=100), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('error_detail', sa.Text(), nullable=True),
    sa.Column('limits', sa.JSON(), nullable=False),
    sa.Column('laps_used', sa.Integer(), nullable=False),
    sa.Column('input_tokens', sa.BigInteger(), nullable=False),
    sa.Column('output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cost_micros', sa.BigInteger(), nullable=False),
    sa.Column('ending', sa.String(length=20), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(), nullable=True),
    sa.Column('cancel_reason', sa.Text(), nullable=True),
    sa.Column('cancelled_by', sa.String(length=200), nullable=True),
    sa.Column('parent_run_id', sa.String(length=200), nullable=True),
    sa.Column('forked_from_lap', sa.Integer(), nullable=True),
    sa.Column('retention', sa.String(length=20), nullable=False),
    sa.Column('recoveries', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('last_checkpoint_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    op.create_index('ix_runs_agent_status', 'runs', ['agent_name', 'status'], unique=False)
    op.create_index('ix_runs_status_wake', 'runs', ['status', 'wake_at'], unique=False)
    op.create_index(op.f('ix_runs_tenant'), 'runs', ['tenant'], unique=False)
    op.create_table('signals',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('delivered_lap', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_signals'))
    )
    op.create_index('ix_signals_run_name', 'signals', ['run_id', 'name', 'delivered_lap'], unique=False)



def downgrade() -> None:

    op.drop_index('ix_signals_run_name', table_name='signals')
    op.drop_table('signals')
    op.drop_index(op.f('ix_runs_tenant'), table_name='runs')
    op.drop_index('ix_runs_status_wake', table_name='runs')
    op.drop_index('ix_runs_agent_status', table_name='runs')
    op.drop_table('runs')
    op.drop_table('messages')
    op.drop_index('ix_events_run', table_name='events')
    op.drop_table('events')
    op.drop_index('ix_effects_run_lap', table_name='effects')
    op.drop_table('effects')
    op.drop_table('checkpoints')
    op.drop_index('ix_approvals_status', table_name='approvals')
    op.drop_index(op.f('ix_approvals_run_id'), table_name='approvals')
    op.drop_table('approvals')

