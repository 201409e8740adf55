"""scale indexes: a tenant's runs newest first, by status, at a million runs

Revision ID: 0015_scale_indexes
Revises: 0013_rate_limits

Why (BENCHMARKS.md, "Costs at a million runs"): with 1,110,000 runs, listing
one tenant's succeeded runs read every run of the tenant through
``ix_runs_tenant`` (11,100 heap fetches, then a sort), and a tenant's runs by
a common label the same. Each index below keeps what a lap pays per commit:

* ``ix_runs_tenant_created`` (tenant, created_at, id) *replaces*
  ``ix_runs_tenant`` (tenant): the same number of indexes on the run row, and
  none of its columns changes in a lap, so it never costs a HOT update; it
  walks a tenant's runs newest first, which serves a label or a listing with
  no status at the page size.
* ``ix_runs_tenant_ended`` and ``ix_runs_tenant_paused`` (tenant, status,
  created_at, id) are partial: only a run that has ended, or is paused, has
  an entry. A run between laps (queued, running) matches neither predicate,
  so the two updates of a lap add no entry to them; the lap that ends or
  pauses a run adds one. Their columns (status included) are already in other
  indexes of the run row, so they change nothing about which updates are HOT.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015_scale_indexes'
down_revision = '0013_rate_limits'
branch_labels = None
depends_on = None

ENDED = sa.text("status IN ('succeeded', 'failed', 'cancelled')")
PAUSED = sa.text("status IN ('waiting', 'sleeping')")


def upgrade() -> None:
    op.create_index('ix_runs_tenant_created', 'runs', ['tenant', 'created_at', 'id'],
                    unique=False)
    op.drop_index('ix_runs_tenant', table_name='runs')
    for name, where in (('ix_runs_tenant_ended', ENDED), ('ix_runs_tenant_paused', PAUSED)):
        op.create_index(name, 'runs', ['tenant', 'status', 'created_at', 'id'], unique=False,
                        postgresql_where=where, sqlite_where=where)


def downgrade() -> None:
    op.drop_index('ix_runs_tenant_paused', table_name='runs')
    op.drop_index('ix_runs_tenant_ended', table_name='runs')
    op.create_index('ix_runs_tenant', 'runs', ['tenant'], unique=False)
    op.drop_index('ix_runs_tenant_created', table_name='runs')
