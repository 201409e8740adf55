"""notify followed: an event sends its NOTIFY only while a reader follows its run

Revision ID: 0023_notify_followed
Revises: 0022_lap_columns_last

Why (BENCHMARKS.md "Lap commits no longer queue
behind NOTIFY"): ``0006_stream_trace``'s trigger sent a ``NOTIFY`` for every
event, and every lap commit inserts one. Postgres commits a transaction that
notified under a single lock for the whole cluster (``PreCommit_Notify``
takes it, the commit's WAL flush happens under it), so concurrent lap
commits went one flush at a time: sampled in an IO-bound fleet of 500 runs,
nearly every busy backend was waiting on that lock (``Lock:object``).

Now a stream reader registers in ``event_followers`` (``store.followers``,
``store.streamfeed``) before it reads, and the trigger notifies only when
the event's run has a registration that has not lapsed: one index probe per
event. Everything else of the trigger (the run's row lock that keeps ids in
commit order, ``0021_event_lock_once``'s exception) is unchanged. A reader
still reads the table after subscribing; an event whose trigger ran just
before the registration committed sends no hint, so the reader reads again
once the transactions running at its registration have ended
(``PgEventWaiter``).

A rolling deploy: a reader of an earlier release never registers, so from
this migration until its process is replaced it sees new events at its poll
(1 s; 15 s for SSE) rather than at once (``deploy/README.md``).

Downgrade: the trigger of ``0021_event_lock_once`` again, and no table.
"""

from __future__ import annotations

from importlib import import_module

import sqlalchemy as sa
from alembic import op

revision = '0023_notify_followed'
down_revision = '0022_lap_columns_last'
branch_labels = None
depends_on = None

_BODY = """
CREATE OR REPLACE FUNCTION agent_worker_event_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = NEW.run_id AND xmin <> pg_current_xact_id()::xid
        FOR NO KEY UPDATE;
    NEW.id := nextval(pg_get_serial_sequence('events', 'id'));
    IF EXISTS (SELECT 1 FROM event_followers WHERE run_id = NEW.run_id
               AND expires_at > timezone('UTC', now())) THEN
        PERFORM pg_notify('aw_ev_' || md5(NEW.run_id), NEW.id::text);
    END IF;
    RETURN NEW;
END
$$"""


def upgrade() -> None:
    op.create_table('event_followers',
    sa.Column('follower', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('follower', name=op.f('pk_event_followers'))
    )
    op.create_index('ix_event_followers_run', 'event_followers', ['run_id', 'expires_at'],
                    unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_BODY)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        import_module("agent_worker.store.migrations.versions.0021_event_lock_once").upgrade()
    op.drop_index('ix_event_followers_run', table_name='event_followers')
    op.drop_table('event_followers')
