"""stream and trace: events get their id under the run's row lock, and a NOTIFY

Revision ID: 0006_stream_trace
Revises: 0002_served_versions

Why (Postgres only; SQLite serializes every writer, so its ids already follow
commit order): a stream reader advances a per-run cursor over ``events.id``.
Ids come from a sequence, so two transactions writing events of one run could
commit out of id order (9 taken first, 10 committed first); a reader that saw
10 and moved past it would never see 9. This trigger takes the run's row lock
(the same lock every update of the run row takes) *before* drawing the id,
so the events of one run are numbered in commit order; it also sends a
``pg_notify`` on the run's channel, delivered at commit and never for a
rollback, which wakes the stream readers of that run (``store.streamfeed``).
"""

from __future__ import annotations

from alembic import op

revision = '0006_stream_trace'
down_revision = '0005_run_state_labels'
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("""
CREATE FUNCTION agent_worker_event_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = NEW.run_id FOR NO KEY UPDATE;
    NEW.id := nextval(pg_get_serial_sequence('events', 'id'));
    PERFORM pg_notify('aw_ev_' || md5(NEW.run_id), NEW.id::text);
    RETURN NEW;
END
$$""")
    op.execute("""
CREATE TRIGGER events_order_notify BEFORE INSERT ON events
FOR EACH ROW EXECUTE FUNCTION agent_worker_event_order()""")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS events_order_notify ON events")
    op.execute("DROP FUNCTION IF EXISTS agent_worker_event_order()")
