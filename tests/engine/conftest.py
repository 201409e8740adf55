"""Engine tests run the in-process engine on both dialects: SQLite hides what
Postgres refuses (U+0000, lone surrogates, a commit's real fencing)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def dialect_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, or this session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'aw.db'}"
    value: str = request.getfixturevalue("database_url")
    return value
