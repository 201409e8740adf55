"""waiting line: the admission index in the order admission reads each line

Revision ID: 0019_waiting_line
Revises: 0015_scale_indexes

Why (BENCHMARKS.md, "Fair share: the fleet's throughput and the head of the
line"): every admission pass, under the fleet-wide advisory lock, read the
head of each tenant's line (its ``PER_TENANT`` first waiting runs, highest
``priority`` first, then the oldest) by reading and sorting the whole backlog
with a window function: 8.5 ms at 2,000 waiting runs, growing with the
backlog. ``ix_runs_admission`` was (status, admitted_lap, tenant, priority,
created_at): after ``status = 'queued' AND admitted_lap = -1 AND tenant = t``
it holds the line with priority ascending, the wrong way for the line. It is
rebuilt as (status, admitted_lap, tenant, priority DESC, created_at, id), so
the line is an index range in order: a pass walks the distinct waiting
tenants (a loose index scan) and reads ``PER_TENANT`` entries of each.

Why the existing index and not a new partial one on the waiting runs: under
row-level security Postgres estimates every query on ``runs`` at a handful of
rows (the policy's ``current_setting(...) = '*'`` gets the default 0.5%), so
it never pays for an ordered scan to save a sort; with a second index on the
same prefix in the wrong order it took that one and sorted the whole line.
With one index whose order is the line's, the ordered scan is also the
cheapest plan, whatever the estimate. It keeps serving what it served: the
slots held (``queued`` with ``admitted_lap >= 0``), the "anyone waiting?"
probe, ``queues``.

What it costs a lap: nothing in index entries. The run row keeps the same
indexes; this one gets an entry on each update that is not HOT, as before
(status and admitted_lap change in a lap, and both were already in it). Each
entry is wider by the run id. No backfill: the index is rebuilt from every
row. On Postgres the rebuild holds a lock that blocks writes to ``runs`` for
as long as it takes (seconds at a million runs; BENCHMARKS.md, "Costs at a
million runs").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019_waiting_line'
down_revision = '0018_lap_hot'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_runs_admission', table_name='runs')
    op.create_index('ix_runs_admission', 'runs',
                    ['status', 'admitted_lap', 'tenant', sa.text('priority DESC'),
                     'created_at', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_runs_admission', table_name='runs')
    op.create_index('ix_runs_admission', 'runs',
                    ['status', 'admitted_lap', 'tenant', 'priority', 'created_at'], unique=False)
