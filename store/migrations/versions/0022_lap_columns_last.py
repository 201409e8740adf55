"""lap columns last: the run-row columns every lap writes move to the row's end

Revision ID: 0022_lap_columns_last
Revises: 0021_event_lock_once

Why (WAL per lap; BENCHMARKS.md "Fewer bytes of WAL a
lap"): a lap updates its run row twice (the claim, the commit), both HOT. For
an update whose new version lands on the old one's page, Postgres logs only
the bytes between the longest common prefix and the longest common suffix of
the two versions. The lap commit's columns were spread from ``next_lap``
(the 6th) to ``last_checkpoint_at`` (the 33rd), so every commit logged the
run's ``input`` and ``limits`` JSON and everything else in between (332
bytes a commit in the benchmark's small run; a run's whole input, up to the
2 KB Postgres keeps inline, in a real one). Now the columns a lap writes are
the row's last, those the claim and a heartbeat write (the lease) at the
very end, so a commit logs about the lap's own columns and a claim the
lease. Every other column keeps its place.

How (Postgres only: SQLite's rows have no such log; ``store.models`` lists
the columns in the new order for any table created from the models): each
moved column is renamed aside and added again at the end; one ``ALTER
COLUMN ... TYPE ... USING`` of them all fills them from the old ones, which
rewrites the table and its indexes once, compact (an UPDATE would have left
a dead version of every row and an index entry for each: measured, the
table and its indexes doubled); then the old columns are dropped (their
bytes stay in each row until its next update, a finished run's for good:
about 80 bytes a row). ``run_totals_update`` (whose WHEN clause names three
of the columns) is dropped meanwhile and created again as
``0017_metrics_rollup`` wrote it; no row changes, so it misses nothing. The
rewrite holds the table's lock until the migration commits (measured with
``python -m bench.upgrade_time``: see BENCHMARKS.md "Fewer bytes of WAL a
lap"); laps wait for it (one whose lease lapsed meanwhile is recovered as
after any stall).

Downgrade: nothing to undo (the columns, their types and constraints are the
same; only their order on disk changed).
"""

from __future__ import annotations

from importlib import import_module

from alembic import op

revision = '0022_lap_columns_last'
down_revision = '0021_event_lock_once'
branch_labels = None
depends_on = None

#: (column, type, NOT NULL) in their new order: what a lap commit writes, then
#: the lease (the claim and heartbeats write only those).
LAP_COLUMNS = (
    ("next_lap", "integer", True),
    ("laps_used", "integer", True),
    ("input_tokens", "bigint", True),
    ("output_tokens", "bigint", True),
    ("cost_micros", "bigint", True),
    ("updated_at", "timestamp without time zone", True),
    ("last_checkpoint_at", "timestamp without time zone", False),
    ("enqueued_at", "timestamp without time zone", False),
    ("lap_attempts", "integer", True),
    ("lease_owner", "character varying(200)", False),
    ("lease_expires_at", "timestamp without time zone", False),
)


def _aside(column: str) -> str:
    return f"{column}_before_0022"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    totals = import_module("agent_worker.store.migrations.versions.0017_metrics_rollup")
    update_trigger = next(ddl for ddl in totals.PG_TRIGGERS if "run_totals_update" in ddl)
    op.execute("DROP TRIGGER run_totals_update ON runs")
    for column, _, _ in LAP_COLUMNS:
        op.execute(f"ALTER TABLE runs RENAME COLUMN {column} TO {_aside(column)}")
    op.execute("ALTER TABLE runs " + ", ".join(
        f"ADD COLUMN {column} {kind}" for column, kind, _ in LAP_COLUMNS))
    filled = []
    for column, kind, required in LAP_COLUMNS:
        filled.append(f"ALTER COLUMN {column} TYPE {kind} USING {_aside(column)}")
        if required:
            filled.append(f"ALTER COLUMN {column} SET NOT NULL")
    op.execute("ALTER TABLE runs " + ", ".join(filled))
    op.execute("ALTER TABLE runs " + ", ".join(
        f"DROP COLUMN {_aside(column)}" for column, _, _ in LAP_COLUMNS))
    op.execute(update_trigger)


def downgrade() -> None:
    pass
