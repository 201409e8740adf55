"""The Prometheus endpoint: ``agent-worker metrics --port 9100``.

Everything is read from Postgres at scrape time, because Postgres is the
truth: one exporter sees the whole fleet, however many workers come and go,
and a worker killed mid-lap loses no metric. Run counts, cost, tokens and
recoveries come from ``store.rollup`` (live runs counted from their rows,
settled runs from totals the database keeps by trigger), as do the pending
approvals: exact at the scrape, at a cost that grows with neither the run nor
the approval table, only with the live (queued, running) runs, whose rows are
read once per scrape for the counts, the fair-share lines and the unserved
runs alike (``store.census``). Counters that the run rows do
not hold (laps committed, retries, budget hits, lap durations) are read
incrementally from the append-only event log, from where it ended when the
exporter started (``EventCounters``), so a scrape costs only the events since
the last one, the first one included.

Run exactly one exporter per database (``replicas: 1``): two would export the
same gauges twice and ``sum()`` would double them. Alert rules that use these
names live in ``deploy/k8s/prometheus-alerts.yaml``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from agent_worker.core.settings import Settings
from agent_worker.core.vocabulary import RUN_STATUSES
from agent_worker.sharemetrics import ShareCollector
from agent_worker.store import stats
from agent_worker.store.sharing import QueueLine
from agent_worker.store.sql import SqlStore

log = logging.getLogger(__name__)

#: Every run status, so each ``agent_worker_runs`` series exists even at zero
#: (``delta()`` over a series that appears mid-window misses its first value).
STATUSES = RUN_STATUSES

#: Lap durations span a scripted lap (milliseconds) to a slow tool (minutes).
LAP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
               600.0)

#: An event id above the watermark is re-read until its row is this old: ids are
#: taken when a transaction inserts, not when it commits, so a lower id can
#: become visible after a higher one.
SETTLE = timedelta(seconds=120)

EVENT_KINDS = ("lap_committed", "retry", "budget_pause", "failing")


def lap_seconds(data: dict[str, Any] | None) -> float | None:
    """A committed lap's duration: the last mark of its trace (taken right
    before the commit), in seconds."""
    trace = (data or {}).get("trace") or []
    if not trace or not isinstance(trace[-1], dict) or "ms" not in trace[-1]:
        return None
    return float(trace[-1]["ms"]) / 1000.0


class EventCounters:
    """Monotonic counters over the event log, advanced scrape by scrape.

    They count the events appended since the exporter started, not since the
    log began: the first scrape only finds where the log ends (reading all of
    it took 210 s at 3.3 M events), so a restarted exporter starts its counters
    at zero, which Prometheus' ``rate()`` and ``increase()`` take as a counter
    reset (each counter also carries its ``_created`` time). To stay exact
    around the start, the events of the last ``SETTLE`` are remembered as seen
    without being counted; an event with a lower id that commits after the
    start is then counted like any late commit.
    """

    def __init__(self) -> None:
        self.watermark: int | None = None
        self.started: datetime | None = None
        self.unsettled: dict[int, datetime] = {}
        self.laps = 0
        self.retries = 0
        self.budget_exceeded = 0
        self.buckets = [0] * (len(LAP_BUCKETS) + 1)  # the last one is +Inf
        self.duration_sum = 0.0

    def start(self, store: SqlStore, now: datetime, *, page: int = 5000) -> None:
        """Position the counters at the log's end (see the class docstring):
        walks back only over the last ``SETTLE`` of events."""
        cursor: int | None = None
        self.watermark = 0
        while True:
            rows = stats.events_before(store, cursor, EVENT_KINDS, limit=page)
            for row in rows:
                if row.created_at < now - SETTLE:
                    self.watermark = row.id
                    break
                self.unsettled[row.id] = row.created_at
            else:
                if len(rows) == page:
                    cursor = rows[-1].id
                    continue
            break
        self.started = now

    def update(self, store: SqlStore, now: datetime, *, page: int = 5000) -> None:
        """Count events not counted yet."""
        if self.watermark is None:
            self.start(store, now, page=page)
        assert self.watermark is not None
        cursor = self.watermark
        while True:
            rows = stats.events_after(store, cursor, EVENT_KINDS, limit=page)
            for row in rows:
                if row.id not in self.unsettled:
                    self._count(row)
                    self.unsettled[row.id] = row.created_at
            if len(rows) < page:
                break
            cursor = rows[-1].id
        settled = [i for i, t in self.unsettled.items() if t < now - SETTLE]
        if settled:
            self.watermark = max(self.watermark, *settled)
            self.unsettled = {i: t for i, t in self.unsettled.items() if i > self.watermark}

    def _count(self, row: stats.EventRow) -> None:
        data = row.data or {}
        if row.kind == "lap_committed":
            self.laps += 1
            seconds = lap_seconds(data)
            if seconds is not None:
                self.duration_sum += seconds
                index = next((i for i, b in enumerate(LAP_BUCKETS) if seconds <= b),
                             len(LAP_BUCKETS))
                self.buckets[index] += 1
        elif row.kind == "retry":
            self.retries += 1
        elif row.kind == "budget_pause" or (
                row.kind == "failing" and data.get("code") == "budget_exceeded"):
            self.budget_exceeded += 1

    def histogram(self) -> list[tuple[str, float]]:
        """Cumulative buckets in Prometheus' form."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*map(str, LAP_BUCKETS), "+Inf"), self.buckets, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


class StoreCollector(Collector):
    """Reads the store on each scrape; see the module docstring."""

    def __init__(self, store: SqlStore, settings: Settings) -> None:
        self.store = store
        self.stale_after = timedelta(seconds=settings.stale_after_seconds)
        self.events = EventCounters()
        self._lock = threading.Lock()  # the HTTP server scrapes from several threads
        #: The last scrape's fair-share lines, ``None`` if it could not read
        #: the store (exported by ShareCollector, which runs next).
        self.queue_lines: list[QueueLine] | None = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = datetime.now(UTC)
            up = GaugeMetricFamily("agent_worker_store_up",
                                   "1 if the last scrape could read the store.")
            try:
                snap = stats.snapshot(self.store, stale_before=now - self.stale_after)
                self.events.update(self.store, now)
                oldest_transaction = stats.oldest_transaction_seconds(self.store)
            except Exception as e:
                log.warning("metrics scrape could not read the store: %s", e)
                self.queue_lines = None
                up.add_metric([], 0)
                yield up
                return
            self.queue_lines = snap.queue_lines
            up.add_metric([], 1)
            yield up
            yield from self._gauges(snap, now)
            yield from self._counters(snap)
            if oldest_transaction is not None:
                yield GaugeMetricFamily(
                    "agent_worker_db_oldest_transaction_seconds",
                    "Age of the oldest transaction open in the store's database (0: none), "
                    "among the sessions the exporter's role may see.",
                    value=oldest_transaction)

    def _gauges(self, snap: stats.Snapshot, now: datetime) -> Iterator[Metric]:
        runs = GaugeMetricFamily("agent_worker_runs", "Runs by status.", labels=["status"])
        for status in sorted(set(STATUSES) | set(snap.runs_by_status)):
            runs.add_metric([status], snap.runs_by_status.get(status, 0))
        yield runs
        yield GaugeMetricFamily(
            "agent_worker_stale_runs",
            "Queued or running runs with no checkpoint for longer than "
            "AGENT_WORKER_STALE_AFTER_SECONDS.", value=snap.stale_runs)
        yield GaugeMetricFamily("agent_worker_pending_approvals",
                                "Approvals waiting for a human.", value=snap.pending_approvals)
        unserved = GaugeMetricFamily(
            "agent_worker_unserved_runs",
            "Queued runs of an agent version no live worker serves (the sweeper does not "
            "re-send their laps until one does).", labels=["agent", "version"])
        for (agent, version), n in sorted(snap.unserved.items()):
            unserved.add_metric([agent, version], n)
        yield unserved
        oldest = snap.oldest_pending_approval
        yield GaugeMetricFamily(
            "agent_worker_pending_approvals_oldest_age_seconds",
            "Age of the oldest pending approval (0 when none is pending).",
            value=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)

    def _counters(self, snap: stats.Snapshot) -> Iterator[Metric]:
        ev = self.events
        since = ev.started.timestamp() if ev.started else None
        yield CounterMetricFamily(
            "agent_worker_laps_committed",
            "Laps committed (lap_committed events) since the exporter started.",
            value=ev.laps, created=since)
        yield CounterMetricFamily(
            "agent_worker_lap_retries",
            "Lap attempts that failed and were retried, since the exporter started.",
            value=ev.retries, created=since)
        yield CounterMetricFamily(
            "agent_worker_run_budget_exceeded",
            "Times a run hit its budget (paused or failed for it), since the exporter "
            "started.", value=ev.budget_exceeded, created=since)
        yield CounterMetricFamily(
            "agent_worker_recoveries",
            "Runs taken over after their worker's lease expired (sum of runs.recoveries).",
            value=sum(t.recoveries for t in snap.by_agent.values()))
        cost = CounterMetricFamily("agent_worker_cost", "Model spend in currency units.",
                                   labels=["agent"])
        tokens = CounterMetricFamily("agent_worker_tokens", "Model tokens.",
                                     labels=["agent", "direction"])
        for agent, t in sorted(snap.by_agent.items()):
            cost.add_metric([agent], t.cost_micros / 1_000_000)
            tokens.add_metric([agent, "input"], t.input_tokens)
            tokens.add_metric([agent, "output"], t.output_tokens)
        yield cost
        yield tokens
        yield HistogramMetricFamily(
            "agent_worker_lap_duration_seconds",
            "Duration of laps committed since the exporter started, claim to commit.",
            buckets=ev.histogram(), sum_value=ev.duration_sum)


def registry_for(store: SqlStore, settings: Settings) -> CollectorRegistry:
    """A registry holding only the store collector (no process metrics of the
    exporter, which would only mislead about the workers)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = StoreCollector(store, settings)
    registry.register(collector)
    registry.register(ShareCollector(lambda: collector.queue_lines))
    return registry


def serve(store: SqlStore, settings: Settings, *, port: int, addr: str = "127.0.0.1"
          ) -> threading.Thread:
    """Start the HTTP endpoint (``/metrics``) in a daemon thread."""
    _server, thread = start_http_server(port, addr=addr, registry=registry_for(store, settings))
    return thread


__all__ = ["EventCounters", "StoreCollector", "lap_seconds", "registry_for", "serve"]
