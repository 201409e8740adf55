"""Database-side faults through real Celery workers on a real (private)
Postgres: every client backend of the database terminated every 5 s; a session
idle in a transaction that holds the vacuum horizon; a worker whose connection
pool keeps one connection while more laps than connections wait on slow tools.

Each keeps a steady load of ``chaos-mix`` runs (``bench.dbfaultkit``) and
checks afterwards that no lap and no payment was lost or doubled, and, for the
first two, that the lap rate came back to its value before the fault within a
minute of its end. Shorter than ``python -m bench.dbfaults`` (60 s of
terminations, a 300 s horizon), whose figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_worker.api import AgentWorker
from agent_worker.demo.vendor import VendorProcess, start_vendor
from bench.dbfaultkit import Feeder, HeldHorizon, Plan, Terminations, drive, pool_phases, verify
from tests.support import Fleet, Proc

# Each test: about 40-60 s on a 2-core machine (fleet start, 6 s before the
# fault, 15 s of it, 10 s or more after, the runs' end; bench.dbfaults runs
# the full durations: 60 s of terminations, a 300 s held horizon); the
# timeout stays above the bounds of bench.dbfaultkit.drive's phases (a minute
# to start, a minute and ten seconds to recover, two minutes to drain), so
# theirs fire first and say what stalled.
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

WORKERS, CONCURRENCY = 2, 2
#: Runs kept going: every slot busy, a lap or two waiting, never a backlog
#: long enough for the sweeper to take a waiting lap for lost.
ACTIVE = WORKERS * CONCURRENCY + 2
PLAN = Plan(baseline=6.0, fault=15.0)


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[VendorProcess]:
    with start_vendor(tmp_path / "vendor.db") as v:
        yield v


def _fleet(fleet: Fleet, vendor: VendorProcess) -> None:
    for _ in range(WORKERS):
        fleet.worker(concurrency=CONCURRENCY, AGENT_WORKER_VENDOR_URL=vendor.url)
    fleet.beat()


def _report(capsys: pytest.CaptureFixture[str], name: str, figures: dict[str, Any]) -> None:
    with capsys.disabled():
        print(f"\n{name}: {json.dumps(figures)}")


def test_backends_terminated_every_5s(aw: AgentWorker, fleet: Fleet, vendor: VendorProcess,
                                      database_url: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _fleet(fleet, vendor)
    fault = Terminations(database_url, every=5.0)
    figures = drive(database_url, Feeder(aw.start_run, "dbf-term-", ACTIVE), fault, PLAN)
    _report(capsys, "terminations", figures)

    assert verify(database_url, "dbf-term-", tmp_path / "vendor.db") == []
    # The fault happened: rounds every 5 s, each finding the fleet's sessions.
    assert fault.rounds >= 3 and fault.terminated >= 2 * fault.rounds, figures
    assert figures["recovered_s"] is not None, figures


def test_idle_transaction_holds_the_horizon(aw: AgentWorker, fleet: Fleet,
                                            vendor: VendorProcess, database_url: str,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _fleet(fleet, vendor)
    fault = HeldHorizon(database_url)
    figures = drive(database_url, Feeder(aw.start_run, "dbf-held-", ACTIVE), fault, PLAN)
    _report(capsys, "held horizon", figures)

    assert verify(database_url, "dbf-held-", tmp_path / "vendor.db") == []
    held = figures["fault"]
    assert held["held"]["state"] == "idle in transaction", held
    # While it was held, no run row version that died could be removed, not
    # even by page pruning; the VACUUM after it removed them.
    dead = held["at_release"]["runs"]["dead"]
    assert dead >= 50 and dead > 2 * held["before"]["runs"]["dead"], held
    assert held["after_vacuum"]["runs"]["dead"] < dead / 2, held
    assert figures["recovered_s"] is not None, figures


#: Threads laps past the worker's whole pool (1 kept + 10 overflow), each read
#: lap sleeping past the lease TTL (3 s), so its lease lives only if the
#: heartbeat gets a connection while the lap waits.
POOL_CONCURRENCY = 16
SLOW_TOOL_SECONDS = 3.5


@pytest.mark.timeout(600)  # two phases, each with drive()'s bounds
def test_pool_of_one_with_slow_tools(aw: AgentWorker, fleet: Fleet, vendor: VendorProcess,
                                     database_url: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    fleet.beat()

    def worker(pool: str) -> Proc:
        return fleet.worker(concurrency=POOL_CONCURRENCY, AGENT_WORKER_VENDOR_URL=vendor.url,
                            AGENT_WORKER_WORKER_POOL="threads",
                            AGENT_WORKER_WORKER_DB_POOL_SIZE=pool)

    phases = pool_phases(database_url, aw.start_run, worker, concurrency=POOL_CONCURRENCY,
                         seconds=10.0, pause=SLOW_TOOL_SECONDS)
    _report(capsys, "pool of one", phases)

    for figures in phases.values():
        assert verify(database_url, figures["prefix"], tmp_path / "vendor.db") == []
        # No lap lost its lease (the heartbeat got a connection) or failed
        # waiting for one.
        assert (figures["recoveries"], figures["retries"]) == (0, 0), figures
    # Opening a connection per lap past the kept one costs some rate on a
    # busy machine (0.83 of it here); starving laps would cost far more, and
    # fail the leases above.
    assert (phases["1"]["baseline_laps_per_s"]
            >= 0.6 * phases["20"]["baseline_laps_per_s"]), phases
