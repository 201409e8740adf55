"""Migration ``0016_run_labels`` on a database that already holds labelled
runs: the upgrade copies every label into ``run_labels`` (and the trigger
takes over), the downgrade drops them and puts back the GIN index and the
policy of ``0003_tenancy``, and the upgrade runs again; SQLite and Postgres."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from agent_worker.store.migrate import alembic_config, upgrade
from tests.support import wait_for

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


def test_a_run_committed_while_the_upgrade_copies_still_gets_its_rows(
        request: pytest.FixtureRequest) -> None:
    """The worst interleaving with a live fleet: a run inserted by code that
    knows no ``run_labels`` (a process still on 0015) after the backfill has
    read ``runs``, committed before the trigger exists. The upgrade's trigger
    waits for that insert's lock, and its second pass copies the run."""
    url = str(request.getfixturevalue("empty_db"))
    upgrade(url, BEFORE)
    old_code = create_engine(url)
    conn = old_code.connect()
    conn.execute(text("SELECT set_config('agent_worker.tenant', '*', false)"))
    conn.execute(text(INSERT), {"id": "late", "t": "acme", "labels": '{"queue": "late"}',
                                "at": datetime(2026, 1, 1)})  # not committed yet
    done: list[BaseException | None] = []

    def migrate() -> None:
        try:
            upgrade(url)
            done.append(None)
        except BaseException as e:  # reported by the assertion below
            done.append(e)

    upgrader = threading.Thread(target=migrate)
    upgrader.start()
    probe = create_engine(url)
    try:
        with probe.connect() as c:  # the upgrade waits for a lock on runs: the trigger's
            assert wait_for(lambda: c.execute(text(
                "SELECT count(*) FROM pg_locks l JOIN pg_class r ON r.oid = l.relation "
                "WHERE NOT l.granted AND r.relname = 'runs'")).scalar() == 1, timeout=60)
        conn.commit()
        upgrader.join(timeout=120)
        assert done == [None]
        rows, _, _ = _state(url)
        assert ("late", "queue", "late", "acme") in {r[:4] for r in rows}
    finally:
        conn.close()
        old_code.dispose()
        probe.dispose()
