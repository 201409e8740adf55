"""A run between laps keeps its stored ``running`` and shows ``queued`` by its
cleared lease (``store.runstatus``), so a lap's two run-row updates change no
indexed column: on Postgres both are HOT. Every reader sees the statuses it
always saw (records, listings, counts), and the sweeper still tells a dead
worker's lap (recovered) from a lost hand-off (re-sent), on both dialects."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import select, text

from agent_worker.core.messages import Message
from agent_worker.store import lapcommit, statements
from agent_worker.store.base import Claim, LapCommit, RunUpdate
from agent_worker.store.listing import RunFilter, search_runs
from agent_worker.store.migrate import alembic_config, upgrade
from agent_worker.store.rows import runs
from agent_worker.store.runpages import status_counts
from agent_worker.store.sql import SqlStore
from tests.store import runs as runs_helper

NOW = datetime(2026, 12, 1, 5, 0, tzinfo=UTC)


def _start(store: SqlStore, tenant: str) -> str:
    return runs_helper.start(store, NOW, prefix="hot", tenant=tenant)


def _claim(store: SqlStore, rid: str, lap: int, owner: str, lease: float = 60) -> Claim:
    return runs_helper.claim(store, rid, lap, owner, NOW, lease)


def _commit_of(claim: Claim) -> LapCommit:
    count = int(claim.checkpoint["message_count"])
    return LapCommit(
        run_id=claim.run.id, lap=claim.lap, owner=claim.owner,
        messages=[(count, Message(role="assistant", content=f"lap {claim.lap}"))],
        checkpoint={**claim.checkpoint, "message_count": count + 1}, schema_version=2,
        update=RunUpdate(status="queued", enqueue=True), usage=(claim.lap, 1, 1, 1),
        event={}, now=NOW)


def _stored(store: SqlStore, rid: str) -> tuple[str, str | None]:
    with store.engine.connect() as c:
        row = c.execute(select(runs.c.status, runs.c.lease_owner).where(runs.c.id == rid)).one()
    return row.status, row.lease_owner


def test_a_run_between_laps_is_shown_queued_and_in_flight_running(store: SqlStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    rid = _start(store, tenant)
    assert _stored(store, rid) == ("queued", None)
    claim = _claim(store, rid, 1, "w1")
    assert claim.run.status == "running" and _stored(store, rid) == ("running", "w1")
    assert store.commit_lap(_commit_of(claim))
    # The commit kept the stored status (no indexed column changed) ...
    assert _stored(store, rid) == ("running", None)
    # ... and every reader sees the run queued, as before.
    run = store.get_run(rid)
    assert run is not None and run.status == "queued"
    assert [r.id for r in store.list_runs(status="queued", tenant=tenant)] == [rid]
    assert store.list_runs(status="running", tenant=tenant) == []
    assert status_counts(store, tenant) == {"queued": 1}
    with store.engine.connect() as c:
        page = search_runs(c, RunFilter(tenant=tenant, status="queued"), cursor=None, limit=5)
        assert [r.id for r in page.runs] == [rid]
        assert search_runs(c, RunFilter(tenant=tenant, status="running"), cursor=None,
                           limit=5).runs == []
    _claim(store, rid, 2, "w2")
    assert [r.id for r in store.list_runs(status="running", tenant=tenant)] == [rid]
    assert status_counts(store, tenant) == {"running": 1}


def test_the_sweeper_recovers_a_dead_lap_and_resends_a_lost_hand_off(own_store: SqlStore) -> None:
    """Both runs are stored ``running``; only the one with a lease is a dead
    worker's lap (recovered, counted); the other lost its message between
    laps and is re-sent without counting a recovery."""
    own_store.heartbeat("sweep-test", [("hot", "1")], now=NOW)
    dead, between = _start(own_store, "t"), _start(own_store, "t")
    _claim(own_store, dead, 1, "gone", lease=-30)  # its worker died: the lease has lapsed
    assert own_store.commit_lap(_commit_of(_claim(own_store, between, 1, "w1")))
    assert _stored(own_store, between) == ("running", None)
    due = {d.run_id: d.lap for d in own_store.sweep(now=NOW, handoff_seconds=-3600,
                                                    resend_max_seconds=60)}
    assert due == {dead: 1, between: 2}
    recovered, resent = own_store.get_run(dead), own_store.get_run(between)
    assert recovered is not None and resent is not None
    assert (recovered.status, recovered.recoveries, recovered.lease_owner) == ("queued", 1, None)
    assert (resent.status, resent.recoveries) == ("queued", 0)
    # Either is claimable again at its lap.
    assert _claim(own_store, dead, 1, "w3").run.status == "running"
    assert _claim(own_store, between, 2, "w4").run.status == "running"


def test_both_updates_of_a_lap_are_hot_on_postgres(database_url: str) -> None:
    """The claim and the continuing commit, run in one transaction so that
    the transaction's own counters say how each update was done: both HOT
    (no new index entry). With the status flipping, neither was."""
    store = SqlStore(database_url)
    try:
        rid = _start(store, "t")
        assert store.commit_lap(_commit_of(_claim(store, rid, 1, "w1")))  # lap 2 is next
        claim = _claim(store, rid, 2, "w2")
        store.release(rid, 2, owner="w2", now=NOW, event={},
                      outcome=RunUpdate(status="queued", enqueue=True))
        with store.engine.begin() as c:
            options = c.execute(text(
                "SELECT reloptions FROM pg_class WHERE relname = 'runs'")).scalar_one()
            assert "fillfactor=80" in options  # migration 0018_lap_hot

            def hot() -> tuple[int, int]:
                row = c.execute(text(
                    "SELECT pg_stat_get_xact_tuples_updated('runs'::regclass), "
                    "pg_stat_get_xact_tuples_hot_updated('runs'::regclass)")).one()
                return int(row[0]), int(row[1])

            # The counters hold what this backend has not reported yet: deltas.
            upd0, hot0 = hot()
            got = c.execute(statements.CLAIM, {
                "run_id": rid, "lap": 2, "owner": "w3", "now": NOW, "expires": NOW,
                "lease_seconds": 60, "any_version": True, "served": []}).first()
            assert got is not None and got.status == "running"
            assert hot() == (upd0 + 1, hot0 + 1), "the claim's update was not HOT"
            commit = _commit_of(claim)
            values = lapcommit.params(LapCommit(**{**commit.__dict__, "owner": "w3"}))
            assert lapcommit.write(c, values)
            assert hot() == (upd0 + 2, hot0 + 2), "the commit's update was not HOT"
            c.rollback()
    finally:
        store.dispose()


def test_the_downgrade_turns_runs_between_laps_back_into_queued(tmp_path: Path) -> None:
    """Older code reads a stored ``running`` as a lap in flight (and would never
    re-send it): the downgrade of 0018_lap_hot leaves it none between laps."""
    url = f"sqlite:///{tmp_path / 'down.db'}"
    upgrade(url)
    store = SqlStore(url)
    try:
        between, in_flight = _start(store, "t"), _start(store, "t")
        assert store.commit_lap(_commit_of(_claim(store, between, 1, "w1")))
        _claim(store, in_flight, 1, "w2")
        parent = ScriptDirectory.from_config(alembic_config(url)).get_revision(
            "0018_lap_hot").down_revision
        assert isinstance(parent, str)
        command.downgrade(alembic_config(url), parent)
        assert _stored(store, between) == ("queued", None)
        assert _stored(store, in_flight) == ("running", "w2")
    finally:
        store.dispose()
