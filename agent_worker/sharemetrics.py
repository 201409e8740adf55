"""Prometheus gauges of fair share, per tenant and agent: what
``agent-worker queues`` shows. The alert ``AgentWorkerTenantStarved``
(deploy/k8s/prometheus-alerts.yaml) fires on the oldest wait for a slot."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent_worker.store.sharing import QueueLine

_LABELS = ["tenant", "agent"]


class ShareCollector(Collector):
    """Exports the queue lines the store collector read in the same scrape
    (``lines``: it runs first; ``None`` when it could not read the store,
    which ``agent_worker_store_up`` reports: this one then yields nothing).

    It reads nothing itself: the lines are sums over the same read of the
    live runs as the run counts (``store.census``), which read them once
    instead of twice, and a scrape with the store down says so within the
    store collector's deadline instead of waiting it out again here."""

    def __init__(self, lines: Callable[[], Sequence[QueueLine] | None]) -> None:
        self.lines = lines

    def collect(self) -> Iterator[Metric]:
        lines = self.lines()
        if lines is None:
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
