"""Prometheus gauges of fair share (issue 17), per tenant and agent: what
``agent-worker queues`` shows. The alert ``AgentWorkerTenantStarved``
(deploy/k8s/prometheus-alerts.yaml) fires on the oldest wait for a slot."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from store.sharing import ShareStore

_LABELS = ["tenant", "agent"]


class ShareCollector(Collector):
    """Reads ``ShareStore.queue_lines`` on each scrape (a failing read is
    ``agent_worker_store_up``'s to report: this one then yields nothing).

    ``store_up`` is the store collector's verdict of the same scrape (it runs
    first): when the store is down this one does not wait out the store's
    retry deadline again, so the scrape says "store down" within seconds."""

    def __init__(self, store: ShareStore, store_up: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        self.store_up = store_up

    def collect(self) -> Iterator[Metric]:
        if not self.store_up():
            return
        try:
            lines = self.store.queue_lines(now=datetime.now(UTC))
        except Exception:
            return
        families = {
            "in_flight": GaugeMetricFamily(
                "agent_worker_share_in_flight",
                "Laps in flight (admitted messages plus running laps).", labels=_LABELS),
            "queued": GaugeMetricFamily("agent_worker_share_queued", "Queued runs.",
                                        labels=_LABELS),
            "throttled": GaugeMetricFamily(
                "agent_worker_share_throttled",
                "Queued runs waiting for a fair-share slot (no message in Redis).",
                labels=_LABELS),
            "oldest": GaugeMetricFamily(
                "agent_worker_share_oldest_wait_seconds",
                "How long the oldest run waiting for a slot has waited (0: none waits).",
                labels=_LABELS),
        }
        for q in lines:
            labels = [q.tenant or "", q.agent]
            families["in_flight"].add_metric(labels, q.in_flight)
            families["queued"].add_metric(labels, q.queued)
            families["throttled"].add_metric(labels, q.throttled)
            families["oldest"].add_metric(labels, q.oldest_wait_seconds or 0.0)
        yield from families.values()


__all__ = ["ShareCollector"]
