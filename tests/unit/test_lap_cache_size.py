"""A worker's lap cache holds more runs than it has laps in flight.

A lap's claim takes an entry and its commit extends it for the run's next
lap, least recently used first out. With 275 laps in flight the fixed 256
entries pushed each entry out before its lap committed: in the cycle below
no claim hits (in ``bench.iobound``, where fewer laps are in flight at
times, 40% did; 58% sized, ``store.lapcache.runs_to_keep``). Checked: that
cycle with the old bound and with the sized one, and that a worker's
runtime is sized from its pool and concurrency, as Celery reports them on
``worker_init``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from celery.concurrency.thread import TaskPool as ThreadsPool

from agent_worker.store.lapcache import DEFAULT_RUNS, Known, LapCache, runs_to_keep
from agent_worker.tasks import runtime as worker_runtime
from tests.unit.conftest import SizedWorker

CREATED = datetime(2026, 12, 5, tzinfo=UTC)
WINDOW = 40


def _hits_in_steady_state(cache: LapCache, laps_in_flight: int, rounds: int = 3) -> int:
    """Runs that each have one lap in flight, their answers coming back in
    the order the laps started (one model latency for all): each lap
    commits, its run's next lap is claimed at once, then the next run's
    lap commits. How many claims of the last round the cache could serve."""
    runs = [f"run-{i}" for i in range(laps_in_flight)]
    state = {"message_count": 1}
    for run in runs:
        cache.claimed(run, Known(CREATED, 1, "w1", WINDOW, state, ()))
    hits = 0
    for lap in range(1, rounds + 1):
        hits = 0
        for run in runs:
            cache.committed(run, lap, "w1", state, [])
            hits += cache.offer(run, lap + 1, WINDOW) is not None
            cache.claimed(run, Known(CREATED, lap + 1, "w1", WINDOW, state, ()))
    return hits


def test_more_laps_in_flight_than_the_old_bound_hit_with_the_sized_cache() -> None:
    laps = 275  # README's threads worker for IO-bound fleets
    assert _hits_in_steady_state(LapCache(DEFAULT_RUNS), laps) == 0
    assert _hits_in_steady_state(LapCache(runs_to_keep(laps)), laps) == laps


def test_a_process_of_one_lap_at_a_time_keeps_the_default() -> None:
    assert runs_to_keep(1) == DEFAULT_RUNS
    assert runs_to_keep(275) == 550


@pytest.mark.parametrize(("pool", "concurrency", "laps"), [
    ("threads", 275, 275),
    (ThreadsPool, 64, 64),  # the CLI hands Celery a class
    ("prefork", 8, 1),  # each child runs one lap
    ("solo", 4, 1),
    ("threads", "auto", 1),  # not resolved yet when worker_init is sent
])
def test_laps_per_process_follow_the_pool(pool: str | type, concurrency: object,
                                          laps: int) -> None:
    assert worker_runtime.laps_per_process(pool, concurrency) == laps


def test_a_threads_workers_runtime_sizes_its_cache(sized_worker: SizedWorker) -> None:
    store = sized_worker("threads", 275).get().store
    assert store.lap_cache.max_runs == 550  # type: ignore[attr-defined]
