"""Leases are decided on the database's clock, not the caller's: a
worker whose clock runs minutes ahead or behind can neither take a
live lease nor lose its own. Postgres only: SQLite's clock is its one
process's (store.dbtime)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from agent_worker.core.messages import Message
from agent_worker.store.base import NewRun
from agent_worker.store.sql import SqlStore

SKEW = timedelta(minutes=5)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    s = SqlStore(database_url)
    yield s
    s.dispose()


def _run(store: SqlStore) -> str:
    rid = f"clock-{uuid.uuid4().hex[:8]}"
    store.create_run(NewRun(
        id=rid, tenant=None, agent_name="a", agent_version="1", input={}, limits={},
        retention="full", checkpoint={"schema_version": 2, "message_count": 1},
        schema_version=2, messages=[Message(role="user", content="hi")],
        now=datetime.now(UTC)))
    return rid


def test_a_clock_running_ahead_takes_no_live_lease(store: SqlStore) -> None:
    rid = _run(store)
    now = datetime.now(UTC)
    assert store.claim(rid, 1, owner="honest", now=now, lease_seconds=10, window_messages=10)
    assert store.claim(rid, 1, owner="ahead", now=now + SKEW, lease_seconds=10,
                       window_messages=10) is None
    due = store.sweep(now=now + SKEW, handoff_seconds=10, resend_max_seconds=60)
    assert rid not in {d.run_id for d in due}
    run = store.get_run(rid)
    assert run is not None and run.lease_owner == "honest" and run.recoveries == 0


def test_a_clock_running_behind_keeps_its_lease(store: SqlStore) -> None:
    rid = _run(store)
    behind = datetime.now(UTC) - SKEW
    assert store.claim(rid, 1, owner="behind", now=behind, lease_seconds=10,
                       window_messages=10)
    assert store.renew_lease(rid, 1, owner="behind", now=behind, lease_seconds=10) == "ok"
    now = datetime.now(UTC)
    assert store.claim(rid, 1, owner="other", now=now, lease_seconds=10,
                       window_messages=10) is None
    store.sweep(now=now, handoff_seconds=10, resend_max_seconds=60)
    run = store.get_run(rid)
    assert run is not None and run.lease_owner == "behind" and run.status == "running"
    assert run.lease_expires_at is not None and run.lease_expires_at > now
