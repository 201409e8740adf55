"""A scrape with the store down answers "store down" once: the fair-share
collector does not wait out the store's 30-second retry deadline again (an
exporter took 38 s to say store_up 0, past Prometheus' 10-second timeout)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_worker.sharemetrics import ShareCollector


class _Unreachable:
    calls = 0

    def queue_lines(self, *, now: datetime) -> list[Any]:
        self.calls += 1
        raise AssertionError("read the store although the scrape found it down")


def test_share_gauges_skip_the_store_the_same_scrape_found_down() -> None:
    store = _Unreachable()
    up = {"store": False}
    collector = ShareCollector(store, lambda: up["store"])  # type: ignore[arg-type]
    assert list(collector.collect()) == [] and store.calls == 0
    up["store"] = True
    assert list(collector.collect()) == [] and store.calls == 1  # tried, failed, yields nothing
