"""The store every store-level test runs against, on both dialects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from store.migrate import upgrade
from store.sql import SqlStore
from tests.conftest import PG_ADMIN
from tests.support import drop_database


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
        url = f"sqlite:///{tmp_path / 'store.db'}"
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
    tests that migrate one from scratch."""
    name = f"aw_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    yield database_url.rsplit("/", 1)[0] + "/" + name
    drop_database(admin, name)
    admin.dispose()
