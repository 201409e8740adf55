"""The scrape's run totals (store.rollup) equal the full aggregation of the run
table they replace, through every way a run row changes, late commits and
concurrent folders; and a scrape reads no run row but the live ones, once,
and one approval row (the plans a real table gets: ``_rows_read``)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, func, select, text, update

from agent_worker.core.messages import Message
from agent_worker.core.settings import get_settings
from agent_worker.core.vocabulary import RUNNABLE, RunStatus
from agent_worker.store import rollup, stats
from agent_worker.store.base import ApprovalRecord, LapCommit, RunUpdate
from agent_worker.store.migrate import upgrade
from agent_worker.store.pauses import insert_approvals
from agent_worker.store.rows import runs
from agent_worker.store.runstatus import shown_column
from agent_worker.store.sql import SqlStore
from tests.store_helpers import new_run

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALE_BEFORE = NOW + timedelta(hours=1)
Totals = dict[tuple[str, str], tuple[int, ...]]


def _reference(conn: Connection) -> Totals:
    """What ``stats.snapshot`` computed before the rollup: the whole run table
    grouped by agent and status."""
    stale = runs.c.status.in_(RUNNABLE) & (runs.c.last_checkpoint_at < STALE_BEFORE)
    status = shown_column()  # as readers see it (store.runstatus)
    rows = conn.execute(select(
        runs.c.agent_name, status, func.count(),
        *[func.coalesce(func.sum(runs.c[c]), 0) for c in rollup.SUMS],
        func.count().filter(stale)).group_by(runs.c.agent_name, status)).all()
    return {(r[0], r[1]): tuple(int(v) for v in r[2:]) for r in rows}


def _rolled(conn: Connection) -> Totals:
    rows = rollup.read_totals(conn, stale_before=STALE_BEFORE)
    out: Totals = {}
    for r in rows:
        values = tuple(int(r[i]) for i in range(2, len(r)))
        out[(str(r.agent_name), str(r.status))] = values
    # A pair every run has left keeps a folded row of zeros: the same as absent.
    return {k: v for k, v in out.items() if any(v)}


def _check(store: SqlStore) -> Totals:
    """Both readings in one snapshot (the module's database is shared: another
    test's writes between two statements must not make them differ)."""
    with store.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        expected, got = _reference(conn), _rolled(conn)
        conn.rollback()
    assert got == expected
    return got


def _lap(store: SqlStore, run_id: str, status: RunStatus, usage: tuple[int, int, int, int],
         **update_: Any) -> None:
    """Claim the run's next lap and commit it leaving the run in ``status``."""
    run = store.get_run(run_id)
    assert run is not None
    lap = run.next_lap
    claim = store.claim(run_id, lap, owner="w", now=NOW, lease_seconds=60, window_messages=5)
    assert claim is not None
    seq = len(store.list_messages(run_id))
    assert store.commit_lap(LapCommit(
        run_id=run_id, lap=lap, owner="w",
        messages=[(seq, Message(role="assistant", content=f"lap {lap}"))],
        checkpoint={"schema_version": 2, "message_count": seq + 1}, schema_version=2,
        update=RunUpdate(status=status, **update_), usage=usage, event={}, now=NOW))


def test_totals_equal_the_full_aggregation_through_a_runs_history(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    agents = [f"tot-a-{tag}", f"tot-b-{tag}"]
    ids = [f"tot-{tag}-{i}" for i in range(10)]
    for i, rid in enumerate(ids):
        store.create_run(new_run(rid, agents[i % 2], now=NOW))
    _check(store)
    # Laps that end, fail, pause and sleep runs (each spends something).
    _lap(store, ids[0], "succeeded", (1, 10, 5, 700), result={"ok": 1})
    _lap(store, ids[1], "succeeded", (1, 20, 6, 900), result={"ok": 2})
    _lap(store, ids[2], "failed", (1, 30, 7, 1100), error_code="boom")
    _lap(store, ids[3], "waiting", (1, 40, 8, 1300), waiting_for=None)
    _lap(store, ids[4], "sleeping", (1, 50, 9, 1500), wake_at=NOW + timedelta(days=1))
    _lap(store, ids[5], "queued", (1, 60, 10, 1700), enqueue=True)  # a lap in flight
    before_fold = _check(store)
    assert before_fold[(agents[0], "succeeded")] == (1, 700, 10, 5, 0, 0)
    assert stats.refresh(store) > 0
    assert _check(store) == before_fold
    # The failed run is retried, then ends again: counted once, as succeeded.
    store.requeue(ids[2], now=NOW, from_statuses=["failed"], event={})
    _check(store)
    _lap(store, ids[2], "succeeded", (1, 1, 1, 1), result={"ok": 3})
    # The waiting run is charged while paused (a child's spend), then resumes.
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == ids[3])
                     .values(cost_micros=runs.c.cost_micros + 5, recoveries=2))
    _check(store)
    store.requeue(ids[3], now=NOW, from_statuses=["waiting"], event={})
    store.request_cancel(ids[6], reason="test", by="op", now=NOW)
    after = _check(store)
    # (usage is the run's total so far, and a retry carries it on)
    assert after[(agents[0], "succeeded")] == (2, 700 + 1, 10 + 1, 5 + 1, 0, 0)
    stats.refresh(store)
    _check(store)
    # Retention prunes history, never the run rows: the totals stay.
    store.prune(checkpoints_before=NOW + timedelta(days=400),
                ledger_before=NOW + timedelta(days=400), batch=500)
    assert _check(store) == after
    with store.engine.connect() as conn:
        assert rollup.unfolded(conn) == 0  # and folded what was pending
    # A run row deleted by hand leaves the totals as it leaves the table.
    with store.engine.begin() as conn:
        conn.execute(runs.delete().where(runs.c.id == ids[1]))
    _check(store)
    with store.engine.connect() as conn:
        folded_rows = conn.execute(select(rollup.run_totals)).all()
    assert folded_rows  # the settled part came from the rollup, not the run table


def test_scrape_snapshot_reads_the_same_as_before(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    for i in range(4):
        store.create_run(new_run(f"snap-{tag}-{i}", f"snap-{tag}", now=NOW))
    _lap(store, f"snap-{tag}-0", "succeeded", (1, 3, 4, 5), result=None)
    snap = stats.snapshot(store, stale_before=STALE_BEFORE)
    totals = snap.by_agent[f"snap-{tag}"]
    assert (totals.runs, totals.cost_micros, totals.input_tokens, totals.output_tokens) == (
        4, 5, 3, 4)
    with store.engine.connect() as conn:
        assert rollup.unfolded(conn) == 0  # the scrape folded what it read
        reference = _reference(conn)
    assert snap.runs_by_status["succeeded"] == sum(
        v[0] for (_, s), v in reference.items() if s == "succeeded")


def test_migration_backfills_and_downgrades(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mig.db'}"
    upgrade(url, "0015_scale_indexes")
    store = SqlStore(url)
    try:
        for i in range(3):
            store.create_run(new_run(f"mig-{i}", "mig", now=NOW))
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id != "mig-2")
                         .values(status="succeeded", cost_micros=7, finished_at=NOW))
        upgrade(url)
        with store.engine.connect() as conn:
            assert rollup.unfolded(conn) == 0
            assert conn.execute(select(rollup.run_totals.c.runs,
                                       rollup.run_totals.c.cost_micros)).all() == [(2, 14)]
        _check(store)
        from alembic import command

        from agent_worker.store.migrate import alembic_config

        command.downgrade(alembic_config(url), "0015_scale_indexes")
        store.create_run(new_run("mig-3", "mig", now=NOW))  # no trigger left behind
        upgrade(url)
        _check(store)
    finally:
        store.dispose()


# --- Postgres: the orders of commits a watermark would get wrong ---------------------------


@pytest.fixture
def pg(database_url: str) -> Iterator[SqlStore]:
    s = SqlStore(database_url)
    yield s
    s.dispose()


def _insert_running(store: SqlStore, ids: list[str], agent: str) -> None:
    for rid in ids:
        store.create_run(new_run(rid, agent, now=NOW))


def _end(conn: Connection, rid: str, cost: int) -> None:
    conn.execute(update(runs).where(runs.c.id == rid).values(
        status="succeeded", cost_micros=cost, finished_at=NOW))


def test_a_run_ended_by_a_transaction_that_commits_late_is_folded_once(pg: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    early, late = f"late-{tag}-x", f"late-{tag}-y"
    _insert_running(pg, [early, late], f"late-{tag}")
    stats.refresh(pg)
    slow = pg.engine.connect()
    try:
        _end(slow, early, 11)  # takes the lower delta id, commits last
        with pg.engine.begin() as fast:
            _end(fast, late, 13)
        assert stats.refresh(pg) >= 1  # folds the later id; the earlier is invisible
        _check(pg)
        slow.commit()
    finally:
        slow.close()
    got = _check(pg)
    assert got[(f"late-{tag}", "succeeded")] == (2, 24, 0, 0, 0, 0)
    with pg.engine.connect() as conn:
        deltas = rollup.run_total_deltas.c
        left = conn.execute(select(deltas.cost_micros)
                            .where(deltas.agent_name == f"late-{tag}")).scalars().all()
    assert left == [11]  # still to fold: a watermark at 13's id would skip it
    stats.refresh(pg)
    assert _check(pg) == got


def test_two_folders_and_a_writer_at_once_count_every_delta_once(pg: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    agent = f"conc-{tag}"
    ids = [f"conc-{tag}-{i}" for i in range(60)]
    _insert_running(pg, ids, agent)
    stop = threading.Event()
    errors: list[BaseException] = []

    def folder() -> None:
        try:
            while not stop.is_set():
                with pg.engine.begin() as conn:
                    rollup.fold(conn, batch=3)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=folder) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i, rid in enumerate(ids):
            with pg.engine.begin() as conn:
                _end(conn, rid, i)
                if i % 3 == 0:  # and some leave again (a retry): a -1 and a +1
                    conn.execute(update(runs).where(runs.c.id == rid).values(status="queued"))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    stats.refresh(pg)
    got = _check(pg)
    assert got[(agent, "succeeded")] == (40, sum(i for i in range(60) if i % 3), 0, 0, 0, 0)


def _rows_read(engine: Any, sql: str, params: Any) -> dict[str, int]:
    """Rows each plan node on ``runs`` or ``approvals`` read (returned plus
    removed by a filter or a recheck), summed per table, with sequential
    and bitmap scans priced out, and for a statement on ``approvals`` sorts
    too (the test database is tiny: the planner would scan anything, or
    fetch every pending approval through a bitmap or another index and sort
    them, where the partial index's first entry is the plan a real table
    gets; CI saw both; the runs grouping sorts by design), next to
    how many of those rows are live (queued or running runs, pending
    approvals) in the same snapshot."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        if re.search(r"\bFROM approvals\b", sql):
            conn.exec_driver_sql("SET LOCAL enable_sort = off")
        live = {
            "runs": conn.execute(select(func.count()).where(
                runs.c.status.in_(RUNNABLE))).scalar_one(),
            "approvals": conn.exec_driver_sql(
                "SELECT count(*) FROM approvals WHERE status = 'pending'").scalar_one()}
        (doc,) = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).scalar_one()
        conn.rollback()
    read = {"runs": 0, "approvals": 0, "live_runs": live["runs"],
            "live_approvals": live["approvals"]}
    todo = [doc["Plan"]]
    while todo:
        node = todo.pop()
        todo.extend(node.get("Plans", []))
        table = node.get("Relation Name")
        if table in ("runs", "approvals"):
            read[table] += (int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
                            + int(node.get("Rows Removed by Filter", 0))
                            + int(node.get("Rows Removed by Index Recheck", 0)))
    return read


def test_a_scrape_reads_the_live_rows_once_and_one_approval(pg: SqlStore) -> None:
    from prometheus_client import generate_latest

    from agent_worker.metrics import registry_for
    from bench import plans

    tag = uuid.uuid4().hex[:6]
    _insert_running(pg, [f"plan-{tag}-{i}" for i in range(3)], f"plan-{tag}")
    with pg.engine.begin() as conn:  # settled runs the old grouping would read
        for i in range(2):
            _end(conn, f"plan-{tag}-{i}", i)
        # Most runs of a real table have ended. Without them the session's
        # database can hold mostly live runs (other tests' queued ones), and
        # the planner then rightly scans a whole index in the grouping's order
        # rather than sort: a plan no real table gets.
        conn.execute(text(
            "INSERT INTO runs (id, agent_name, agent_version, status, input, limits, "
            "retention, recoveries, created_at, next_lap, laps_used, input_tokens, "
            "output_tokens, cost_micros, updated_at, lap_attempts) "
            "SELECT :prefix || g, :agent, '1', 'succeeded', '{}', '{}', 'full', 0, :now, 2, 1, "
            "0, 0, 0, :now, 0 FROM generate_series(1, 2000) AS g"),
            {"prefix": f"plan-{tag}-ended-", "agent": f"plan-{tag}",
             "now": NOW.replace(tzinfo=None)})
        # pending approvals, which the count used to read one by one
        insert_approvals(conn, [ApprovalRecord(
            id=f"plan-{tag}-ap{i}", run_id=f"plan-{tag}-2", effect_key=f"plan-{tag}:{i}",
            tool_name="t", arguments={}, reason=None, owner=None, status="pending",
            on_timeout="reject", escalate_to=None, requested_at=NOW, timeout_at=None,
            decided_by=None, comment=None, decided_at=None) for i in range(3)])
    with pg.engine.connect() as conn:
        conn.execute(text("ANALYZE runs"))
        conn.commit()
    registry = registry_for(pg, get_settings())
    generate_latest(registry)  # the first scrape: positions the event counters
    sent = plans.statements(pg.engine, lambda: generate_latest(registry))
    assert len(sent) >= 3
    over, reading_runs = [], []
    for sql, params in sent:
        read = _rows_read(pg.engine, sql, params)
        assert read["live_runs"] > 0 and read["live_approvals"] >= 3
        if read["runs"]:
            reading_runs.append(sql[:100])
        if read["runs"] > read["live_runs"] or read["approvals"] > 1:
            over.append((sql[:300], read))
    assert over == []
    # counts, fair-share lines and unserved runs all come from one read
    assert len(reading_runs) == 1, reading_runs
