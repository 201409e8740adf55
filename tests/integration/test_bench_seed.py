"""``bench.seed`` at a tiny size: the rows a million-run benchmark stands on
are rows the store reads as its own, the metrics rollup holds what its
triggers would have made of them, and the seed leaves the schema exactly as
the migrations made it (indexes rebuilt, row-level security forced again, the
triggers back on)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import func, select

from agent_worker.store import rollup
from agent_worker.store.listing import RunFilter, search_runs
from agent_worker.store.migrate import upgrade
from agent_worker.store.rows import approvals
from agent_worker.store.sql import SqlStore
from bench.common import create_database, drop_database, libpq_url, sa_url
from bench.scrape_totals import full, rolled
from bench.seed import FILLED, Shape, run_id, seed

pytestmark = pytest.mark.integration

SCHEMA = """
SELECT (SELECT array_agg(indexrelid::regclass::text ORDER BY indexrelid::regclass::text)
        FROM pg_index WHERE indrelid = ANY(%(t)s::regclass[])),
       (SELECT array_agg(relname::text ORDER BY relname) FROM pg_class
        WHERE relname = ANY(%(t)s::text[]) AND relforcerowsecurity),
       (SELECT tgenabled FROM pg_trigger WHERE tgname = 'events_order_notify'),
       (SELECT tgenabled FROM pg_trigger WHERE tgname = 'run_labels_from_run'),
       (SELECT array_agg(tgname::text || tgenabled::text ORDER BY tgname) FROM pg_trigger
        WHERE tgname IN ('run_totals_insert', 'approval_totals_insert'))
"""


@pytest.fixture
def seeded(database_url: str) -> Iterator[tuple[str, tuple[object, ...]]]:
    name = f"aw_seed_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        upgrade(sa_url(url))
        with psycopg.connect(libpq_url(url)) as conn:
            before = conn.execute(SCHEMA, {"t": list(FILLED)}).fetchone()
        assert before is not None
        counts = seed(url, Shape(finished=50, paused=10, active=4))
        assert counts["runs"] == 64
        yield url, tuple(before)
    finally:
        drop_database(name)


def test_seeded_runs_read_back_through_the_store(
        seeded: tuple[str, tuple[object, ...]]) -> None:
    url, schema_before = seeded
    with psycopg.connect(libpq_url(url)) as conn:
        assert tuple(conn.execute(SCHEMA, {"t": list(FILLED)}).fetchone() or ()) == schema_before
    store = SqlStore(sa_url(url))
    try:
        runs = store.list_runs(limit=1000)
        assert len(runs) == 64
        assert Counter(r.status for r in runs) == {
            "succeeded": 45, "failed": 4, "cancelled": 1, "waiting": 5, "sleeping": 5,
            "queued": 2, "running": 2}
        waiting = next(r for r in runs if r.status == "waiting")
        assert waiting.waiting_for is not None
        assert store.find_approval(None, waiting.id).status == "pending"
        assert len(store.list_checkpoints(run_id(3))) == 1
        with store.engine.connect() as c:
            page = search_runs(c, RunFilter(labels={"queue": "vip"}, tenant="tenant-10"),
                               cursor=None, limit=10)
        assert [r.id for r in page.runs] == [run_id(10)]
    finally:
        store.engine.dispose()


def test_seeded_rollups_equal_a_full_aggregation(
        seeded: tuple[str, tuple[object, ...]]) -> None:
    url, _ = seeded
    store = SqlStore(sa_url(url))
    try:
        with store.engine.connect() as conn:
            table = conn.execute(rollup.run_totals.select()).all()
            reference = full(conn)
            by_status: dict[str, int] = dict(conn.execute(
                select(approvals.c.status, func.count()).group_by(approvals.c.status)).all())
            approval_table: dict[str, int] = dict(
                conn.execute(rollup.approval_totals.select()).all())
            # the seed wrote totals, not deltas
            assert [rollup.unfolded(conn, r) for r in rollup.ROLLUPS] == [0, 0]
            assert rolled(conn) == reference  # the scrape's reading, live rows included
            pending = conn.execute(rollup.pending_query()).one()
        folded = {(r.agent_name, r.status): (r.runs, *(r._mapping[c] for c in rollup.SUMS))
                  for r in table}
        assert folded == {k: v for k, v in reference.items() if k[1] in rollup.SETTLED}
        assert {s for _, s in folded} == {"succeeded", "failed", "cancelled", "waiting",
                                          "sleeping"}
        assert approval_table == by_status == {"pending": 5}
        assert pending.pending == 5 and pending.oldest is not None
    finally:
        store.engine.dispose()
