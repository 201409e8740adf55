"""The scrape's pending-approval count (``approval_totals``, migration
``0020_approval_totals``) equals a count of the approvals through every way an
approval's status changes, folded or not, on both dialects; and the migration
backfills, downgrades and upgrades again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, delete, func, inspect, select

from agent_worker.store import rollup, stats
from agent_worker.store.base import ApprovalRecord
from agent_worker.store.migrate import alembic_config, upgrade
from agent_worker.store.pauses import insert_approvals
from agent_worker.store.rows import approvals
from agent_worker.store.sql import SqlStore
from tests.store_helpers import new_run

BEFORE = "0019_waiting_line"


def _approval(approval_id: str, run_id: str, *, requested_at: datetime,
              timeout_at: datetime, on_timeout: str = "reject",
              escalate_to: str | None = None) -> ApprovalRecord:
    return ApprovalRecord(
        id=approval_id, run_id=run_id, effect_key=f"{approval_id}:1:0", tool_name="refund",
        arguments={}, reason=None, owner="alice", status="pending", on_timeout=on_timeout,
        escalate_to=escalate_to, requested_at=requested_at, timeout_at=timeout_at,
        decided_by=None, comment=None, decided_at=None)


def _by_status(conn: Connection) -> dict[str, int]:
    return {s: int(n) for s, n in conn.execute(
        select(approvals.c.status, func.count()).group_by(approvals.c.status))}


def _rolled(conn: Connection) -> dict[str, int]:
    out: dict[str, int] = {}
    for table in (rollup.approval_totals, rollup.approval_total_deltas):
        for s, n in conn.execute(select(table.c.status, table.c.approvals)):
            out[s] = out.get(s, 0) + int(n)
    return {s: n for s, n in out.items() if n}  # a status every approval left: absent


def _check(store: SqlStore) -> tuple[int, Any]:
    """The totals against a count of the approvals, and the scrape's pending
    count and oldest request against the approvals', in one snapshot (the
    Postgres database is shared with other tests)."""
    with store.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        counted, rolled = _by_status(conn), _rolled(conn)
        pending, oldest = conn.execute(rollup.pending_query()).one()
        reference_oldest = conn.execute(select(func.min(approvals.c.requested_at))
                                        .where(approvals.c.status == "pending")).scalar_one()
        conn.rollback()
    assert rolled == counted
    assert (pending, oldest) == (counted.get("pending", 0), reference_oldest)
    return int(pending), oldest


def test_pending_count_follows_every_change_of_an_approvals_status(own_store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    now = datetime.now(UTC)
    rids = [f"apt-{tag}-{i}" for i in range(4)]
    for rid in rids:
        own_store.create_run(new_run(rid, f"apt-{tag}", now=now))
    start, _ = _check(own_store)
    ids = [f"ap-{tag}-{i}" for i in range(4)]
    old = now - timedelta(days=400)  # the oldest pending of the database while it is
    with own_store.engine.begin() as conn:
        insert_approvals(conn, [
            _approval(ids[0], rids[0], requested_at=old, timeout_at=now + timedelta(days=1)),
            _approval(ids[1], rids[1], requested_at=now, timeout_at=now + timedelta(days=1)),
            # due at the next sweep: one times out, one escalates (stays pending)
            _approval(ids[2], rids[2], requested_at=now, timeout_at=now - timedelta(days=1)),
            _approval(ids[3], rids[3], requested_at=now, timeout_at=now - timedelta(days=1),
                      on_timeout="escalate", escalate_to="boss")])
    pending, oldest = _check(own_store)  # unfolded: counted from the deltas
    assert pending == start + 4 and oldest == old
    assert stats.refresh(own_store) >= 4
    assert _check(own_store) == (pending, oldest)
    own_store.decide_approval(ids[0], None, approved=True, by="alice", comment=None, now=now)
    own_store.decide_approval(ids[1], None, approved=False, by="alice", comment=None, now=now)
    pending, oldest = _check(own_store)
    assert pending == start + 2 and oldest != old
    own_store.sweep(now=datetime.now(UTC), handoff_seconds=10, resend_max_seconds=60)
    with own_store.engine.connect() as conn:
        mine = dict(conn.execute(select(approvals.c.id, approvals.c.status)
                                 .where(approvals.c.id.in_(ids))).all())
    assert mine == {ids[0]: "approved", ids[1]: "rejected", ids[2]: "timed_out",
                    ids[3]: "pending"}  # escalated: a new owner, the same status
    _check(own_store)
    stats.refresh(own_store)
    with own_store.engine.begin() as conn:  # an approval deleted by hand leaves the count too
        conn.execute(delete(approvals).where(approvals.c.id.in_([ids[1], ids[3]])))
    _check(own_store)
    stats.refresh(own_store)
    with own_store.engine.connect() as conn:
        assert rollup.unfolded(conn, rollup.APPROVALS) == 0
    _check(own_store)
    snap = stats.snapshot(own_store, stale_before=now)
    with own_store.engine.connect() as conn:
        assert snap.pending_approvals == _by_status(conn).get("pending", 0)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_migration_backfills_downgrades_and_upgrades_again(
        dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'apt.db'}" if dialect == "sqlite"
           else request.getfixturevalue("empty_db"))
    upgrade(url, BEFORE)
    now = datetime.now(UTC)
    store = SqlStore(url)
    try:
        store.create_run(new_run("mig-r", now=now))
        with store.engine.begin() as conn:
            insert_approvals(conn, [
                _approval(f"mig-{i}", "mig-r", requested_at=now - timedelta(minutes=i),
                          timeout_at=now + timedelta(days=1)) for i in range(3)])
        store.decide_approval("mig-0", None, approved=True, by="a", comment=None, now=now)
        upgrade(url)
        with store.engine.connect() as conn:
            assert rollup.unfolded(conn, rollup.APPROVALS) == 0  # backfilled, no deltas
            assert dict(conn.execute(select(rollup.approval_totals)).all()) == {
                "approved": 1, "pending": 2}
        assert _check(store) == (2, now - timedelta(minutes=2))
        command.downgrade(alembic_config(url), BEFORE)
        tables = set(inspect(store.engine).get_table_names())
        assert not tables & {"approval_totals", "approval_total_deltas"}
        # no trigger left behind: it would write to a table that is gone
        store.decide_approval("mig-1", None, approved=False, by="a", comment=None, now=now)
        upgrade(url)
        assert _check(store) == (1, now - timedelta(minutes=2))
    finally:
        store.dispose()
