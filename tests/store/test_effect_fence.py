"""The fence an effect's intent is written under (``store.rows.fence``) on
Postgres: a row lock, not a write, that still holds off a cancel or another
worker's claim until the intent commits, and refuses a lost lease."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import OperationalError

from agent_worker.core.errors import LeaseLost
from agent_worker.store.rows import fence, runs
from agent_worker.store.sql import SqlStore
from tests.store import runs as runs_helper

NOW = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)


def _cancel(store: SqlStore, rid: str) -> None:
    """A cancel's write of the run row, from another session, giving up at
    once if the row is locked."""
    with store.engine.begin() as c:
        c.execute(text("SET LOCAL lock_timeout = '1ms'"))
        c.execute(update(runs).where(runs.c.id == rid).values(cancel_requested_at=NOW))


def _version(store: SqlStore, rid: str) -> str:
    """The id of the transaction that wrote the run row's current version."""
    with store.engine.connect() as c:
        return str(c.execute(text("SELECT xmin::text FROM runs WHERE id = :r"),
                             {"r": rid}).scalar_one())


def test_the_fence_locks_the_run_row_without_writing_it(pg_store: SqlStore) -> None:
    rid = runs_helper.start(pg_store, NOW, prefix="fence")
    runs_helper.claim(pg_store, rid, 1, "w1", NOW)
    version = _version(pg_store, rid)
    with pg_store.engine.begin() as conn:
        fence(conn, rid, 1, "w1", NOW, cancel=True)
        with pytest.raises(OperationalError, match="lock timeout"):
            _cancel(pg_store, rid)
    assert _version(pg_store, rid) == version  # the fence wrote nothing
    _cancel(pg_store, rid)  # the lock went with the transaction
    with pg_store.engine.begin() as conn, pytest.raises(LeaseLost):
        fence(conn, rid, 1, "w1", NOW, cancel=True)
    with pg_store.engine.begin() as conn, pytest.raises(LeaseLost):
        fence(conn, rid, 1, "someone else", NOW, cancel=False)
    with pg_store.engine.begin() as conn:
        fence(conn, rid, 1, "w1", NOW, cancel=False)
        assert conn.execute(select(runs.c.lease_owner).where(runs.c.id == rid)).scalar() == "w1"
