"""The Prometheus endpoint (``agent-worker metrics --port``) scraped over HTTP
after a few runs: every value equals what the store says.

The runs are driven lap by lap in this process (no broker, no sweeper, so no
other test's leftovers are touched); the exporter is a real subprocess on the
same database. Expected values are recomputed here from the public API, over
every run in the session's database, because the exporter sees them all.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import tests.agents  # registers the test agents in this process
from agent_worker.agent import Agent, register
from agent_worker.api import AgentWorker
from agent_worker.core.budget import Budget
from agent_worker.core.settings import Settings
from agent_worker.engine.lap import run_lap
from agent_worker.metrics import lap_seconds
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.runtime import Runtime
from agent_worker.store.base import TERMINAL, DueLap
from agent_worker.store.sql import SqlStore
from tests.store_helpers import delete_run
from tests.support import ROOT, Proc, wait_for

pytestmark = pytest.mark.integration

TENANT = "metrics-test"

def _priced_script(r: Any) -> Any:
    return turn(f"lap {r.lap}", [("step", {"n": r.lap})]) if r.lap < 3 else turn("done")


register(Agent(name="metrics-priced", tools=[tests.agents.step],
               model=lambda: ScriptedModel(_priced_script), window_messages=2000,
               prices={"scripted": {"input_per_mtok": "1", "output_per_mtok": "2"}}))
# Registered only in this process: no worker of any test ever runs it.
register(Agent(name="metrics-stale", model=lambda: ScriptedModel(lambda r: turn("x"))))


class Drop:
    """No broker: this test drives every lap itself."""

    def send(self, lap: DueLap) -> None:
        pass


def drive(aw: AgentWorker, run_id: str) -> None:
    """Run laps until the run finishes or pauses (retries are due at once)."""
    for _ in range(50):
        run = aw.get_run(run_id)
        if run.status in TERMINAL or run.status in ("waiting", "sleeping"):
            return
        run_lap(aw.rt, run_id, run.next_lap)
    raise AssertionError(f"run {run_id} did not settle")


@pytest.fixture
def aw_local(database_url: str) -> Iterator[AgentWorker]:
    store = SqlStore(database_url)
    aw = AgentWorker(Runtime(store=store, dispatcher=Drop(), settings=Settings(
        database_url=database_url, max_lap_attempts=2, retry_backoff_seconds=0.0)))
    created: list[str] = []
    start = aw.start_run

    def tracked(*args: Any, **kwargs: Any) -> Any:
        run = start(*args, tenant=TENANT, **kwargs)
        created.append(run.id)
        return run

    aw.start_run = tracked  # type: ignore[method-assign]
    yield aw
    for run_id in created:
        delete_run(store, run_id)
    store.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def expected(aw: AgentWorker, stale_after: float) -> dict[str, Any]:
    """The metrics, recomputed from the public API over the whole database."""
    runs = aw.list_runs(limit=100_000)
    now = datetime.now(UTC)
    events = [e for r in runs for e in aw.events(r.id)]
    commits = [e for e in events if e.kind == "lap_committed"]
    cost: Counter[str] = Counter()
    tokens: Counter[tuple[str, str]] = Counter()
    for r in runs:
        cost[r.agent_name] += r.cost_micros
        tokens[(r.agent_name, "input")] += r.input_tokens
        tokens[(r.agent_name, "output")] += r.output_tokens
    approvals = aw.list_approvals()
    return {
        "status": Counter(r.status for r in runs),
        "stale": sum(1 for r in runs if r.status in ("queued", "running")
                     and r.last_checkpoint_at is not None
                     and (now - r.last_checkpoint_at).total_seconds() > stale_after),
        "laps": len(commits),
        "lap_seconds": sum(lap_seconds(e.data) or 0.0 for e in commits),
        "retries": sum(1 for e in events if e.kind == "retry"),
        "budget": sum(1 for e in events if e.kind == "budget_pause" or (
            e.kind == "failing" and (e.data or {}).get("code") == "budget_exceeded")),
        "recoveries": sum(r.recoveries for r in runs),
        "cost": {a: c / 1_000_000 for a, c in cost.items()},
        "tokens": dict(tokens),
        "approvals": len(approvals),
        "oldest_approval": min((a.requested_at for a in approvals), default=None),
    }


@pytest.fixture
def exporter(worker_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc([sys.executable, "-m", "agent_worker.cli", "metrics", "--port", str(port),
                 "--addr", "127.0.0.1"],
                {**worker_env, "AGENT_WORKER_STALE_AFTER_SECONDS": "1"},
                tmp_path / "metrics.log").start()
    url = f"http://127.0.0.1:{port}/metrics"

    def up() -> bool:
        assert proc.alive(), proc.log.read_text()
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return True
        except OSError:
            return False

    try:
        wait_for(up, timeout=60, interval=0.2, what="the metrics endpoint")
        yield url
    finally:
        proc.stop()


def test_scrape_matches_the_store(aw_local: AgentWorker, exporter: str) -> None:
    aw = aw_local
    # The event counters count from the exporter's start (its first scrape,
    # when the fixture saw it up): earlier tests' events are not theirs.
    base = expected(aw, stale_after=1.0)
    for _ in range(2):
        drive(aw, aw.start_run("metrics-priced", {}).id)
    poison = aw.start_run("poison", {})
    drive(aw, poison.id)
    assert aw.get_run(poison.id).status == "failed"
    over = aw.start_run("loop", {"laps": 5}, budget=Budget(max_laps=2))
    drive(aw, over.id)
    assert aw.get_run(over.id).error_code == "budget_exceeded"
    approval = aw.start_run("pauses", {"plan": [["wire_money", {"account": "m",
                                                                "amount_cents": 1}]]})
    drive(aw, approval.id)
    assert aw.get_run(approval.id).status == "waiting"
    stale = aw.start_run("metrics-stale", {})
    wait_for(lambda: (datetime.now(UTC) - stale.created_at).total_seconds() > 1.5,
             timeout=10, what="the queued run to go stale")

    want = expected(aw, stale_after=1.0)
    got = scrape(exporter)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value("agent_worker_store_up") == 1
    for status in ("queued", "running", "waiting", "sleeping", "succeeded", "failed",
                   "cancelled"):
        assert value("agent_worker_runs", status=status) == want["status"][status], status
    assert value("agent_worker_stale_runs") == want["stale"] >= 1
    laps = want["laps"] - base["laps"]
    assert value("agent_worker_laps_committed_total") == laps
    assert value("agent_worker_lap_retries_total") == want["retries"] - base["retries"] >= 1
    assert value("agent_worker_run_budget_exceeded_total") == (
        want["budget"] - base["budget"]) >= 1
    assert value("agent_worker_recoveries_total") == want["recoveries"]
    assert value("agent_worker_pending_approvals") == want["approvals"] >= 1
    age = (datetime.now(UTC) - want["oldest_approval"]).total_seconds()
    assert 0 < value("agent_worker_pending_approvals_oldest_age_seconds") <= age
    for agent, cost in want["cost"].items():
        assert value("agent_worker_cost_total", agent=agent) == pytest.approx(cost)
    assert want["cost"]["metrics-priced"] > 0
    for (agent, direction), n in want["tokens"].items():
        assert value("agent_worker_tokens_total", agent=agent, direction=direction) == n
    assert value("agent_worker_lap_duration_seconds_count") == laps
    assert value("agent_worker_lap_duration_seconds_bucket", le="+Inf") == laps
    assert value("agent_worker_lap_duration_seconds_sum") == pytest.approx(
        want["lap_seconds"] - base["lap_seconds"], rel=1e-6, abs=1e-6)

    # Counters advance by exactly the new laps on the next scrape.
    extra = aw.start_run("metrics-priced", {})
    drive(aw, extra.id)
    new_laps = aw.get_run(extra.id).lap
    again = scrape(exporter)
    assert again[("agent_worker_laps_committed_total", ())] == laps + new_laps
    assert again[("agent_worker_runs", (("status", "succeeded"),))] == (
        want["status"]["succeeded"] + 1)


def test_endpoint_reports_an_unreachable_store(worker_env: dict[str, str],
                                               tmp_path: Path) -> None:
    """The exporter stays up when Postgres is gone and says so (store_up 0), so
    the alert on missing metrics tells "exporter down" from "database down"."""
    port = free_port()
    env = {**worker_env,
           "AGENT_WORKER_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/none"}
    done = subprocess.run([sys.executable, "-m", "agent_worker.cli", "metrics", "--once",
                           "--json", "--port", str(port)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"agent_worker_store_up"' in done.stdout and '"value": 0' in done.stdout
