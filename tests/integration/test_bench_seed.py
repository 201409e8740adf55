"""``bench.seed`` at a tiny size: the rows a million-run benchmark stands on
are rows the store reads as its own, and the seed leaves the schema exactly as
the migrations made it (indexes rebuilt, row-level security forced again, the
events trigger back on)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from bench.common import create_database, drop_database, libpq_url, sa_url
from bench.seed import FILLED, Shape, run_id, seed
from store.listing import RunFilter, search_runs
from store.migrate import upgrade
from store.sql import SqlStore

pytestmark = pytest.mark.integration

SCHEMA = """
SELECT (SELECT array_agg(indexrelid::regclass::text ORDER BY indexrelid::regclass::text)
        FROM pg_index WHERE indrelid = ANY(%(t)s::regclass[])),
       (SELECT array_agg(relname::text ORDER BY relname) FROM pg_class
        WHERE relname = ANY(%(t)s::text[]) AND relforcerowsecurity),
       (SELECT tgenabled FROM pg_trigger WHERE tgname = 'events_order_notify'),
       (SELECT tgenabled FROM pg_trigger WHERE tgname = 'run_labels_from_run')
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
        seed(url, Shape(finished=50, paused=10, active=4))
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
