"""event lock once: an event's trigger skips the run's row lock its transaction already holds

Revision ID: 0021_event_lock_once
Revises: 0020_approval_totals

Why (WAL per lap; BENCHMARKS.md "Fewer bytes of WAL a
lap"): ``0006_stream_trace``'s trigger takes the run's row lock (``FOR NO KEY
UPDATE``) before an event draws its id, so one run's events are numbered in
commit order. Locking a row version writes a WAL record (54 bytes) even when
the transaction holds the lock already, and a lap commit always does: it
updated the run row in the same statement, just before the event. Now the
trigger locks only a run row version it did not write itself. A version
whose ``xmin`` is the transaction's own id was written by it (an UPDATE,
which holds the row lock until commit, or an INSERT, which nobody else can
see until then), so any other writer of that run's events still waits for
this transaction before drawing an id: the order is unchanged. A version
written in a subtransaction carries the subtransaction's id and is locked as
before (correct, merely not spared).

Postgres only (SQLite serializes writers). Downgrade restores the old body.
"""

from __future__ import annotations

from alembic import op

revision = '0021_event_lock_once'
down_revision = '0020_approval_totals'
branch_labels = None
depends_on = None

_BODY = """
CREATE OR REPLACE FUNCTION agent_worker_event_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = NEW.run_id{skip} FOR NO KEY UPDATE;
    NEW.id := nextval(pg_get_serial_sequence('events', 'id'));
    PERFORM pg_notify('aw_ev_' || md5(NEW.run_id), NEW.id::text);
    RETURN NEW;
END
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_BODY.format(skip=" AND xmin <> pg_current_xact_id()::xid"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_BODY.format(skip=""))
