"""The store every store-level test runs against, on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store.migrate import upgrade
from store.sql import SqlStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    """A fresh SQLite file, or this session's Postgres database (shared by the
    session's tests: look for your own rows, never for exactly yours)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("database_url")
    s = SqlStore(url)
    yield s
    s.dispose()
