"""The head of each tenant's line (``store.admitting._waiting``) on
both dialects: Postgres reads it through a loose index scan and a LATERAL
``LIMIT`` over ``ix_runs_admission`` (migration 0019), SQLite through the
window function; both must give each tenant its ``PER_TENANT`` first waiting
runs, highest priority first, then the oldest, and nothing else.

Runs are written straight into the table for one agent of each test's own
(the Postgres database is shared by the session; ``_waiting`` reads only the
agents it is given). That the Postgres statement reads the heads and not the
backlog is shown by ``python -m bench.admission_pass`` (its EXPLAIN ANALYZE),
not here: the planner's choice on a small shared test table proves nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from agent_worker.store import admitting
from agent_worker.store.admitting import PER_TENANT, THROTTLED
from agent_worker.store.migrate import upgrade
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore


@pytest.fixture
def store(dialect_url: str) -> Iterator[SqlStore]:
    upgrade(dialect_url)  # the SQLite file is new; the session's Postgres is at head
    s = SqlStore(dialect_url)
    yield s
    s.dispose()


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _row(agent: str, tenant: str | None, i: int, *, priority: int = 0,
         status: str = "queued", admitted: int = THROTTLED) -> dict[str, Any]:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i)
    return {"id": f"{agent}-{tenant}-{i:03d}", "tenant": tenant, "agent_name": agent,
            "agent_version": "1", "status": status, "next_lap": 0, "input": {},
            "limits": {}, "created_at": at, "updated_at": at, "admitted_lap": admitted,
            "priority": priority}


def _line(rows: list[dict[str, Any]]) -> list[str]:
    """Admission's order: the highest priority, then the oldest, then the id."""
    ordered = sorted(rows, key=lambda r: (-r["priority"], r["created_at"], r["id"]))
    return [r["id"] for r in ordered][:PER_TENANT]


def _heads(store: SqlStore, agent: str, **which: Any) -> dict[str, list[str]]:
    which = {"only": None, "skip": [], **which}
    with store.engine.connect() as conn:
        found = admitting._waiting(conn, [agent], datetime.now(UTC), **which)
    lines: dict[str, list[str]] = {}
    for r in found:
        lines.setdefault(r.tenant_key, []).append(r.id)
    return lines


def _fill(store: SqlStore) -> tuple[str, str, str, dict[str, list[dict[str, Any]]]]:
    """A long line (past ``PER_TENANT``, priorities mixed, the highest ones
    oldest last), a short one, runs with no tenant, and runs of the same agent
    that are not waiting (admitted, running)."""
    agent, big, small = f"wl-{_uid()}", f"big-{_uid()}", f"small-{_uid()}"
    lines = {
        big: [_row(agent, big, i, priority=(2 if i % 7 == 0 else i % 2)) for i in range(
            PER_TENANT + 30)],
        small: [_row(agent, small, i, priority=-1 if i == 0 else 0) for i in range(3)],
        "": [_row(agent, None, i) for i in range(2)],
    }
    others = [_row(agent, big, 900, priority=9, admitted=0),
              _row(agent, small, 901, priority=9, status="running", admitted=0)]
    with store.engine.begin() as conn:
        conn.execute(insert(runs), [r for rows in lines.values() for r in rows] + others)
    return agent, big, small, lines


def test_each_tenant_gets_the_head_of_its_line_in_order(store: SqlStore) -> None:
    agent, big, small, lines = _fill(store)
    got = _heads(store, agent)
    assert got == {tenant: _line(rows) for tenant, rows in lines.items()}
    assert len(got[big]) == PER_TENANT
    assert got[small][-1] == f"{agent}-{small}-000"  # the lowest priority last


def test_skipped_and_chosen_tenants_and_the_line_with_no_tenant(store: SqlStore) -> None:
    agent, big, small, lines = _fill(store)
    assert set(_heads(store, agent, skip=[big])) == {small, ""}
    assert set(_heads(store, agent, skip=[""])) == {big, small}
    assert _heads(store, agent, only=[small, ""]) == {
        small: _line(lines[small]), "": _line(lines[""])}
    assert _heads(store, agent, only=[]) == {}


def test_postgres_reads_the_same_heads_as_the_window_function(database_url: str) -> None:
    """The LATERAL statement is Postgres's (SQLite runs the window function)."""
    store = SqlStore(database_url)
    agent, big, _, _ = _fill(store)
    now = datetime.now(UTC)
    cases: list[dict[str, Any]] = [{"only": None, "skip": []}, {"only": None, "skip": [big]},
                  {"only": [big, ""], "skip": []}]
    for which in cases:
        with store.engine.connect() as conn:
            new = [r.id for r in conn.execute(admitting.heads([agent], now, **which))]
            old = [r.id for r in conn.execute(admitting.ranked_heads([agent], now, **which))]
        assert new == old and new
    store.dispose()
