"""lap hot: room on each page of the run row for HOT updates

Revision ID: 0018_lap_hot
Revises: 0015_scale_indexes

Why (BENCHMARKS.md "HOT run-row updates"): a lap updates its
run row twice (the claim, the commit). Neither update changes an indexed
column any more (``store.runstatus``: a run between laps keeps the stored
``running``, its cleared lease shows it ``queued``), so both can be HOT: the
new row version goes on the same page and no index gets an entry. That needs
free room on the page, which a table filled to 100% lacks; ``fillfactor``
keeps 20% of each page free for it (Postgres only; SQLite has no such knob).

Existing data: every stored status keeps its meaning under the new reading
(a stored ``queued`` is shown ``queued``, a stored ``running`` with a lease
``running``), so the upgrade rewrites no row; existing pages get the room as
Postgres prunes and refills them (no table rewrite, no long lock).

Downgrade: older code reads a stored ``running`` as a lap in flight and never
re-sends it, so runs between laps go back to ``queued`` first.
"""

from __future__ import annotations

from alembic import op

revision = '0018_lap_hot'
down_revision = '0017_metrics_rollup'
branch_labels = None
depends_on = None

#: Percent of each page of ``runs`` that inserts fill (the rest is for HOT updates).
FILLFACTOR = 80


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f'ALTER TABLE runs SET (fillfactor = {FILLFACTOR})')


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'queued' "
               "WHERE status = 'running' AND lease_owner IS NULL")
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('ALTER TABLE runs RESET (fillfactor)')
