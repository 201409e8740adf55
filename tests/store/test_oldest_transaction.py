"""``agent_worker_db_oldest_transaction_seconds``: what the alert on a
long-open transaction (deploy/k8s/prometheus-alerts.yaml) reads. A session
idle in a transaction holds the vacuum horizon of the whole database
(BENCHMARKS.md, "Database-side faults")."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from agent_worker.core.settings import Settings
from agent_worker.metrics import registry_for
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from tests.support import wait_for

GAUGE = "agent_worker_db_oldest_transaction_seconds"


def test_an_idle_transaction_shows_until_it_ends(own_database_url: str) -> None:
    store = SqlStore(own_database_url)
    holder = create_engine(own_database_url)
    registry = registry_for(store, Settings())
    try:
        def age() -> float:
            value = registry.get_sample_value(GAUGE)
            assert value is not None
            return value

        assert age() < 1.0  # the scrape's own transaction does not count
        with holder.connect() as conn:
            conn.execute(text("SELECT txid_current()"))  # idle in a transaction from here
            wait_for(lambda: age() >= 1.5, timeout=30, interval=0.5,
                     what="the open transaction's age")
        assert age() < 1.0
    finally:
        holder.dispose()
        store.dispose()


def test_sqlite_exports_no_such_gauge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'aw.db'}"
    upgrade(url)
    store = SqlStore(url)
    try:
        assert registry_for(store, Settings()).get_sample_value(GAUGE) is None
        assert registry_for(store, Settings()).get_sample_value("agent_worker_store_up") == 1
    finally:
        store.dispose()
