"""What every Postgres session of ours starts with (``store.db.make_engine``).
Postgres only: the settings are Postgres's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from agent_worker.store.db import make_engine


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    e = make_engine(database_url)
    yield e
    e.dispose()


def test_sessions_start_with_jit_off_and_in_the_system_scope(engine: Engine) -> None:
    """JIT off: it compiled any plan whose estimate passed ``jit_above_cost``
    for 50-100 ms first (the admission pass's planner hints cost a node left
    without an index at 10^10), so a 0.3 ms read of the waiting line took
    60-130 ms under the admission lock (``store.db._without_jit``)."""
    with engine.connect() as c:
        assert c.execute(text("SHOW jit")).scalar() == "off"
        assert c.execute(text("SELECT current_setting('agent_worker.tenant')")).scalar() == "*"
