"""Migration ``0016_run_labels`` on a database that already holds labelled
runs: the upgrade copies every label into ``run_labels`` (and the trigger
takes over), the downgrade drops them and puts back the GIN index and the
policy of ``0003_tenancy``, and the upgrade runs again; SQLite and Postgres."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from store.migrate import alembic_config, upgrade
from tests.store.test_migrations import empty_db  # noqa: F401  (the fixture)

BEFORE = "0015_scale_indexes"
INSERT = ("INSERT INTO runs (id, tenant, agent_name, agent_version, status, next_lap, "
          "lap_attempts, input, limits, laps_used, input_tokens, output_tokens, cost_micros, "
          "retention, recoveries, created_at, updated_at, labels) VALUES "
          "(:id, :t, 'a', '1', 'succeeded', 1, 0, '{}', '{}', 0, 0, 0, 0, 'full', 0, "
          ":at, :at, :labels)")
LABELLED = {"r1": ("acme", '{"customer": "Zoë 🚀", "queue": "vip"}'),
            "r2": ("globex", '{"queue": "std"}'), "r3": ("acme", None)}


def _state(url: str) -> tuple[set[tuple[str, ...]], set[str], str | None]:
    engine = create_engine(url)
    with engine.connect() as c:
        postgres = c.dialect.name == "postgresql"
        if postgres:
            c.execute(text("SELECT set_config('agent_worker.tenant', '*', false)"))
        tables = {r[0] for r in c.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'" if postgres
            else "SELECT name FROM sqlite_master WHERE type = 'table'"))}
        rows = {tuple(str(x) for x in r) for r in c.execute(text(
            "SELECT run_id, key, value, tenant, created_at FROM run_labels"))
                } if "run_labels" in tables else set()
        indexes = {r[0] for r in c.execute(text(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'runs'" if postgres
            else "SELECT name FROM sqlite_master WHERE type = 'index'"))}
        policy = c.execute(text(
            "SELECT pg_get_expr(polqual, polrelid) FROM pg_policy "
            "WHERE polrelid = 'runs'::regclass")).scalar() if postgres else None
    engine.dispose()
    return rows, indexes, policy


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_upgrade_copies_the_labels_and_downgrade_restores_0015(
        dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'aw.db'}" if dialect == "sqlite"
           else str(request.getfixturevalue("empty_db")))
    upgrade(url, BEFORE)
    engine = create_engine(url)
    with engine.begin() as c:
        if dialect == "postgres":
            c.execute(text("SELECT set_config('agent_worker.tenant', '*', true)"))
        for i, (run, (tenant, labels)) in enumerate(LABELLED.items()):
            c.execute(text(INSERT), {"id": run, "t": tenant, "labels": labels,
                                     "at": datetime(2026, 1, 1, 0, 0, i)})
    engine.dispose()
    _, indexes_before, policy_before = _state(url)
    upgrade(url)
    rows, indexes, policy = _state(url)
    assert {r[:4] for r in rows} == {("r1", "customer", "Zoë 🚀", "acme"),
                                     ("r1", "queue", "vip", "acme"),
                                     ("r2", "queue", "std", "globex")}
    assert {r[4][:19] for r in rows} == {"2026-01-01 00:00:00", "2026-01-01 00:00:01"}
    assert "ix_runs_labels" in indexes_before and "ix_runs_labels" not in indexes
    if dialect == "postgres":
        assert policy is not None and policy_before is not None and "COALESCE" in policy
        # The same rows, estimated apart: only the system arm's COALESCE differs.
        assert policy.replace("COALESCE((", "(").replace("), false)", ")") == policy_before
    command.downgrade(alembic_config(url), BEFORE)
    assert _state(url) == (set(), indexes_before, policy_before)
    upgrade(url)
    assert _state(url) == (rows, indexes, policy)
