"""Alembic is the only way the schema changes: upgrades from empty (and from
every earlier revision) reach a schema equal to the models, and concurrent
``db upgrade`` calls (every pod's init step) are safe."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from agent_worker.store.migrate import MIGRATIONS, alembic_config, current, upgrade
from agent_worker.store.tables import metadata


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _schema_diff(url: str) -> list[object]:
    engine = create_engine(url)
    with engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), metadata)
    engine.dispose()
    return list(diff)


def test_upgrade_from_empty_matches_models(empty_db: str) -> None:
    assert current(empty_db) is None
    upgrade(empty_db)
    assert current(empty_db) == _revisions()[-1]
    assert _schema_diff(empty_db) == []


@pytest.mark.parametrize("start", _revisions())
def test_upgrade_from_every_earlier_revision(empty_db: str, start: str) -> None:
    upgrade(empty_db, start)
    upgrade(empty_db)
    assert current(empty_db) == _revisions()[-1]
    assert _schema_diff(empty_db) == []


def test_concurrent_upgrades_apply_once(empty_db: str) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade(empty_db)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert current(empty_db) == _revisions()[-1]


def test_migrations_folder_is_append_only_chain() -> None:
    revisions = _revisions()
    assert revisions[0] == "0001" and len(set(revisions)) == len(revisions)
    assert (MIGRATIONS / "versions").is_dir()
