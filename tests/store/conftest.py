"""The store every store-level test runs against, on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from tests.conftest import new_database


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    """A fresh SQLite file, or this session's Postgres database (shared by the
    session's tests: look for your own rows, never for exactly yours)."""
    yield from _store_on(request, tmp_path, "database_url")


@pytest.fixture(params=["sqlite", "postgres"])
def own_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    """A fresh SQLite file, or a Postgres database of the test's own, for a
    verb that reads the whole database (the sweep: ``own_database_url``)."""
    yield from _store_on(request, tmp_path, "own_database_url")


def _store_on(request: pytest.FixtureRequest, tmp_path: Path,
              postgres_url_fixture: str) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'agent_worker.store.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue(postgres_url_fixture)
    s = SqlStore(url)
    yield s
    s.dispose()


@pytest.fixture
def pg_store(database_url: str) -> Iterator[SqlStore]:
    """A store on this session's Postgres database, for what only Postgres does."""
    s = SqlStore(database_url)
    yield s
    s.dispose()


@pytest.fixture
def empty_db(database_url: str) -> Iterator[str]:
    """The URL of a new, empty Postgres database (dropped afterwards), for
    tests that migrate one from scratch (after the session's database, so a
    missing server skips them as it skips the rest)."""
    with new_database("aw_mig") as url:
        yield url
