"""A scrape with the store down answers "store down" once: the fair-share
gauges read nothing themselves (an exporter whose second collector retried
the store took 38 s to say store_up 0, past Prometheus' 10-second timeout);
they export the lines the store collector read in the same scrape, from the
same read of the live runs as the run counts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from agent_worker.core.settings import Settings
from agent_worker.metrics import registry_for
from agent_worker.sharemetrics import ShareCollector
from agent_worker.store import stats
from agent_worker.store.sharing import QueueLine


def _samples(registry: Any) -> dict[str, float]:
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for m in registry.collect() for s in m.samples}


def test_share_gauges_export_the_lines_of_the_scrape_and_nothing_when_it_failed() -> None:
    lines: list[QueueLine] | None = None
    collector = ShareCollector(lambda: lines)
    assert list(collector.collect()) == []
    lines = [QueueLine(tenant="acme", agent="a", in_flight=2, queued=3, throttled=1,
                       oldest_wait_seconds=4.5)]
    got = {s.name: (s.labels, s.value) for m in collector.collect() for s in m.samples}
    labels = {"tenant": "acme", "agent": "a"}
    assert got == {"agent_worker_share_in_flight": (labels, 2),
                   "agent_worker_share_queued": (labels, 3),
                   "agent_worker_share_throttled": (labels, 1),
                   "agent_worker_share_oldest_wait_seconds": (labels, 4.5)}


def test_a_scrape_with_the_store_down_reads_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[datetime] = []
    line = QueueLine(tenant="acme", agent="a", in_flight=1, queued=0, throttled=0,
                     oldest_wait_seconds=None)
    down = {"store": True}

    def snapshot(_store: Any, *, stale_before: datetime) -> stats.Snapshot:
        calls.append(stale_before)
        if down["store"]:
            raise ConnectionError("the database is away")
        return stats.Snapshot(queue_lines=[line])

    monkeypatch.setattr(stats, "snapshot", snapshot)
    monkeypatch.setattr("agent_worker.metrics.EventCounters.update", lambda *_a, **_k: None)
    monkeypatch.setattr(stats, "oldest_transaction_seconds", lambda _store: None)
    registry = registry_for(object(), Settings())  # type: ignore[arg-type]
    samples = _samples(registry)
    assert samples["agent_worker_store_up[]"] == 0
    assert not any(k.startswith("agent_worker_share") for k in samples)
    assert len(calls) == 1
    down["store"] = False
    samples = _samples(registry)
    assert samples["agent_worker_store_up[]"] == 1
    assert samples["agent_worker_share_in_flight[('agent', 'a'), ('tenant', 'acme')]"] == 1
    assert len(calls) == 2
    down["store"] = True  # and the last good scrape's lines are not exported again
    assert not any(k.startswith("agent_worker_share") for k in _samples(registry))
