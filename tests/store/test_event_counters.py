"""The exporter's event counters start where the log ends (its first scrape
reads no old event) and still count an event that commits late, around the
start as after it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from agent_worker.metrics import SETTLE, EventCounters
from agent_worker.store import stats
from agent_worker.store.rows import events
from agent_worker.store.sql import SqlStore


def _lap(store: SqlStore, run_id: str, at: datetime) -> None:
    store.record_event(run_id, 1, "lap_committed", {"trace": [{"ms": 5}]}, now=at)


def test_first_scrape_reads_only_the_settle_window(store: SqlStore,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)
    rid = f"ev-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        _lap(store, rid, now - SETTLE - timedelta(minutes=5))  # long settled
    _lap(store, rid, now - timedelta(seconds=5))  # inside the window
    walked: list[stats.EventRow] = []
    real = stats.events_before

    def spy(*args: Any, **kwargs: Any) -> list[stats.EventRow]:
        rows = real(*args, **kwargs)
        walked.extend(rows)
        return rows

    monkeypatch.setattr(stats, "events_before", spy)
    counters = EventCounters()
    counters.update(store, now, page=2)
    assert counters.laps == 0 and counters.started == now
    with store.engine.connect() as conn:
        top = conn.execute(select(func.max(events.c.id))).scalar_one()
    assert counters.watermark is not None and counters.watermark < top
    # Walked back from the end to the first settled event, not through the log.
    cutoff = now - SETTLE
    assert [r.created_at < cutoff for r in walked].index(True) >= len(walked) - 2
    _lap(store, rid, now)
    counters.update(store, now)
    assert counters.laps == 1 and counters.buckets[0] == 1
    counters.update(store, now + SETTLE * 3)  # settles; nothing is counted twice
    counters.update(store, now + SETTLE * 3)
    assert counters.laps == 1


def test_an_event_committing_late_across_the_start_is_counted(database_url: str) -> None:
    store = SqlStore(database_url)
    try:
        rid = f"ev-{uuid.uuid4().hex[:8]}"
        now = datetime.now(UTC)
        slow = store.engine.connect()
        try:
            slow.execute(insert(events).values(run_id=rid, lap=1, kind="lap_committed",
                                               data=None, created_at=now))
            _lap(store, rid, now)  # a higher id, committed first
            counters = EventCounters()
            counters.update(store, now)  # starts: the committed one is before the start
            slow.commit()  # the lower id becomes visible after the start
        finally:
            slow.close()
        counters.update(store, now)
        assert counters.laps == 1
    finally:
        store.dispose()
