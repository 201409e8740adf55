"""Engine tests run the in-process engine on both dialects: SQLite hides what
Postgres refuses (U+0000, lone surrogates, a commit's real fencing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker.agent import Registry
from agent_worker.inprocess import InProcessWorker
from store.sql import SqlStore


@pytest.fixture(params=["sqlite", "postgres"])
def dialect_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, or this session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'aw.db'}"
    value: str = request.getfixturevalue("database_url")
    return value


@pytest.fixture
def bare_worker(dialect_url: str) -> Iterator[InProcessWorker]:
    """An in-process worker on ``dialect_url`` with a registry of its own (each
    test registers its agents), no retry backoff and three lap attempts."""
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    w.rt.registry = Registry()
    yield w
    assert isinstance(w.rt.store, SqlStore)
    w.rt.store.dispose()
