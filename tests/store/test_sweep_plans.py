"""The sweeper's statements are planned for their values on every pass
(``store.sweeping.CUSTOM_PLANS``). Its connection sends the same statements
every few seconds, so psycopg prepares them and Postgres would try a generic
plan, which at a million runs read the whole run table for the expired-lease
pick (BENCHMARKS.md, "Fewer bytes of WAL a lap": 210-240 ms a pass from the
11th on, 6 ms planned for its values)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text

from agent_worker.store import sweeping
from agent_worker.store.sql import SqlStore


def test_a_sweepers_connection_never_runs_a_generic_plan(pg_store: SqlStore) -> None:
    with pg_store.engine.connect() as conn:
        for _ in range(15):  # psycopg prepares from the 5th; Postgres tries generic from the 6th
            with conn.begin():
                sweeping.sweep(conn, now=datetime.now(UTC), handoff_seconds=60,
                               resend_max_seconds=600, limit=100)
        prepared = conn.execute(text(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%FROM runs%'")).all()
        conn.rollback()
    assert prepared, "the sweep's statements were never prepared"
    assert [(p.statement[:60], p.generic_plans) for p in prepared if p.generic_plans] == []
    assert all(p.custom_plans >= 10 for p in prepared)
