"""A threads worker keeps its Postgres connections (``tasks.dbpool``): with
more laps touching the database at once than the store's default pool kept
(5, plus 5 opened and closed per use), every lap past the tenth connected and
disconnected around its statements, several new Postgres sessions a second
per worker in ``bench.iobound``."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import QueuePool

from agent_worker.core.settings import Settings
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.dbpool import OVERFLOW
from agent_worker.tasks.runtime import system_store

THREADS = 16


def _connects(store: SqlStore, relaxed: bool) -> list[int]:
    """A counter of new connections of the store's engine (or its relaxed one)."""
    engine = store._relaxed_engine() if relaxed else store.engine
    count = [0]

    @event.listens_for(engine, "connect")
    def _counted(*_: Any) -> None:
        count[0] += 1

    return count


def _burst(store: SqlStore, relaxed: bool) -> None:
    """``THREADS`` threads hold a connection each at the same moment."""
    barrier = threading.Barrier(THREADS)
    engine = store._relaxed_engine() if relaxed else store.engine

    def one() -> None:
        with engine.connect() as conn:
            barrier.wait(timeout=30)
            conn.exec_driver_sql("SELECT 1")

    threads = [threading.Thread(target=one) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def test_a_worker_keeps_its_connections_through_bursts(database_url: str) -> None:
    store = system_store(Settings(database_url=database_url, worker_db_pool_size=THREADS))
    try:
        assert isinstance(store.engine.pool, QueuePool)
        assert store.engine.pool.size() == THREADS
        for relaxed in (False, True):  # the lap's engine and the journal's
            counted = _connects(store, relaxed)
            _burst(store, relaxed)
            assert counted[0] == THREADS  # opened on demand...
            _burst(store, relaxed)
            _burst(store, relaxed)
            assert counted[0] == THREADS  # ...and kept: no connection per lap
    finally:
        store.dispose()


def test_past_the_kept_connections_a_burst_reconnects(database_url: str) -> None:
    """The cost the pool size avoids: past the kept connections a burst
    borrows overflow ones (``tasks.dbpool.OVERFLOW``), closed after use and
    opened again by the next burst. Served, but at a connection per use."""
    kept = THREADS - OVERFLOW
    store = system_store(Settings(database_url=database_url, worker_db_pool_size=kept))
    try:
        counted = _connects(store, relaxed=False)
        _burst(store, relaxed=False)
        assert counted[0] == THREADS
        _burst(store, relaxed=False)
        assert counted[0] == THREADS + OVERFLOW
    finally:
        store.dispose()
