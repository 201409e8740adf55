"""Pauses as first-class state through real Postgres, Redis and ``celery -A
tasks worker`` processes.

A paused run is a row: no worker process, thread or Celery message waits for
it. So these tests kill the whole fleet while runs are paused, start new
workers later, and check that decisions, timers and signal timeouts (fired by
the sweeper, with time moved forward by a fleet-wide clock instead of sleeping),
cancellations and budgets all come out exactly once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from agent_worker.api import AgentWorker
from agent_worker.core.budget import Budget
from agent_worker.core.errors import AlreadyDecidedError
from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from tests.agents import OffsetClock
from tests.conftest import DatabaseClock
from tests.principals import acting
from tests.support import Fleet, Proc, wait_for

pytestmark = pytest.mark.integration

YEAR = 365 * 86400
WIRE = ["wire_money", {"account": "acct-7", "amount_cents": 4200}]


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[VendorProcess]:
    with start_vendor(tmp_path / "vendor.db") as v:
        yield v


def _plan(*steps: list[Any]) -> dict[str, Any]:
    return {"plan": [list(s) for s in steps]}


def _assert_laps_once(aw: AgentWorker, run_id: str, laps: int) -> None:
    """Checkpoints 0..laps with no gap and one commit event per lap: nothing replayed."""
    assert [c[0] for c in aw.checkpoints(run_id)] == list(range(laps + 1))
    commits = Counter(e.lap for e in aw.events(run_id) if e.kind == "lap_committed")
    assert commits == Counter(range(1, laps + 1)), commits
    msgs = aw.messages(run_id)
    assert [m.seq for m in msgs] == list(range(len(msgs)))


def _tool_texts(aw: AgentWorker, run_id: str) -> list[str]:
    return [m.message.content for m in aw.messages(run_id) if m.message.role == "tool"]


def _paused(aw: AgentWorker, run_id: str) -> bool:
    return aw.get_run(run_id).status in ("waiting", "sleeping")


def test_approval_waits_with_no_worker_alive(aw: AgentWorker, fleet: Fleet,
                                             vendor: VendorProcess) -> None:
    env = {"AGENT_WORKER_VENDOR_URL": vendor.url}
    first = fleet.worker(concurrency=1, **env)
    run = aw.start_run("pauses", _plan(WIRE))
    waiting = aw.wait(run.id, timeout=90, until=lambda r: r.status == "waiting")
    assert waiting.waiting_for is not None and waiting.waiting_for.startswith("approval:")
    assert waiting.lease_owner is None and waiting.lap == 1

    first.kill(signal.SIGKILL)
    assert not any(p.alive() for p in fleet.procs), "the whole fleet is down"
    [approval] = aw.list_approvals(run_id=run.id)
    assert approval.owner == "ops" and approval.status == "pending"
    assert (approval.tool_name, approval.arguments) == ("wire_money", WIRE[1])
    age = aw.rt.clock.now() - approval.requested_at
    assert age.total_seconds() > 0
    assert vendor.client.stats()["applied"] == 0, "nothing irreversible before the approval"

    fleet.worker(concurrency=1, **env)
    acting(aw, "alice").approve(run.id, comment="invoice checked")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    # Lap 1 asked, lap 2 made the approved call, lap 3 answered; none replayed.
    _assert_laps_once(aw, run.id, 3)
    stats = vendor.client.stats()
    assert stats["by_key"] == {f"{run.id}:1:0": 1} and stats["applied"] == 1

    with pytest.raises(AlreadyDecidedError, match="approved by alice"):
        acting(aw, "bob").reject(run.id, comment="second thoughts")
    with pytest.raises(AlreadyDecidedError):
        acting(aw, "alice").approve(approval.id)
    account = _tool_texts(aw, run.id)[0]
    assert "alice" in account and "invoice checked" in account and "acct-7" in account


def test_timers_and_timeouts_fire_through_the_sweeper_across_restarts(
        aw: AgentWorker, fleet: Fleet, vendor: VendorProcess, tmp_path: Path,
        db_clock: DatabaseClock) -> None:
    """An approval timeout (7 days), a sleep (1 day) and a signal timeout (1 hour):
    each fires when the clock passes it and a sweep runs, while no worker is
    alive; workers started afterwards run the woken laps. Timers are compared
    on the database's clock, so the database's time moves with the fleet's."""
    fleet_clock = OffsetClock(tmp_path / "clock")

    class Both:
        path = fleet_clock.path
        now = fleet_clock.now

        @staticmethod
        def advance(**delta: float) -> None:
            fleet_clock.advance(**delta)
            db_clock.advance(**delta)

    clock = Both()
    env = {"AGENT_WORKER_VENDOR_URL": vendor.url,
           "AGENT_WORKER_TEST_CLOCK_FILE": str(clock.path)}
    aw.rt.clock = fleet_clock
    first = fleet.worker(concurrency=2, **env)
    approval = aw.start_run("pauses", _plan(WIRE)).id
    sleeper = aw.start_run("pauses", _plan(["sleep", {"seconds": 86400}])).id
    waiter = aw.start_run("pauses", _plan(
        ["wait_for_signal", {"name": "export_done", "timeout_seconds": 3600}])).id
    wait_for(lambda: all(_paused(aw, rid) for rid in (approval, sleeper, waiter)),
             timeout=90, what="three runs to pause")
    first.kill(signal.SIGKILL)

    def statuses() -> tuple[str, str, str]:
        return (aw.get_run(approval).status, aw.get_run(sleeper).status,
                aw.get_run(waiter).status)

    aw.sweep()
    assert statuses() == ("waiting", "sleeping", "waiting"), "nothing is due yet"
    clock.advance(hours=1, minutes=1)
    aw.sweep()
    assert statuses() == ("waiting", "sleeping", "queued")
    clock.advance(days=1)
    aw.sweep()
    assert statuses() == ("waiting", "queued", "queued")
    clock.advance(days=6)
    aw.sweep()
    assert statuses() == ("queued", "queued", "queued")
    [timed_out] = aw.list_approvals(status="timed_out", run_id=approval)
    assert timed_out.decided_by == "system:timeout"

    # No worker was alive to serve these laps when they woke, so nothing was
    # sent; once one is, the sweeper re-sends the unclaimed hand-offs.
    fleet.worker(concurrency=2, **env)
    fleet.beat(**env)
    for rid in (approval, sleeper, waiter):
        done = aw.wait(rid, timeout=120)
        assert done.status == "succeeded", done.error_detail
        _assert_laps_once(aw, rid, 3)
    assert vendor.client.stats()["applied"] == 0, "a timed-out approval does nothing"
    assert "timed out by system:timeout" in _tool_texts(aw, approval)[0]
    assert _tool_texts(aw, sleeper)[0].startswith("Slept from ")
    assert "(timed out)" in _tool_texts(aw, waiter)[0]


def test_cancel_compensates_in_reverse_once_despite_a_kill(
        aw: AgentWorker, fleet: Fleet, vendor: VendorProcess) -> None:
    """Two applied compensatable effects, then the run sleeps; cancelling it
    undoes both in reverse order. The worker is SIGKILLed inside the first
    compensation and the vendor drops the connection after applying the
    retry's undo: the vendor still sees each undo exactly once."""
    fleet.worker(concurrency=1, AGENT_WORKER_VENDOR_URL=vendor.url,
                 AGENT_WORKER_FAULTS="in_compensation")
    fleet.beat()
    run = aw.start_run("pauses", _plan(
        ["book", {"order_id": "o1", "amount_cents": 100}],
        ["book", {"order_id": "o2", "amount_cents": 200}],
        ["sleep", {"seconds": YEAR}]))
    aw.wait(run.id, timeout=90, until=lambda r: r.status == "sleeping")
    vendor.client.inject("drop_after_apply", path="/notices")

    acting(aw, "carol").cancel(run.id, reason="customer withdrew")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "cancelled", done.error_detail
    assert (done.cancelled_by, done.cancel_reason) == ("carol", "customer withdrew")
    faults = Path(fleet.env["AGENT_WORKER_FAULT_DIR"])
    assert (faults / "in_compensation.0").exists(), "the kill never happened"

    with sqlite3.connect(vendor.db_path) as db:
        seen = [(kind, key, json.loads(req)) for kind, key, req in db.execute(
            "SELECT kind, idem_key, request FROM effects WHERE applied = 1 ORDER BY seq")]
    assert [(kind, key) for kind, key, _ in seen] == [
        ("refund", f"{run.id}:1:0"), ("refund", f"{run.id}:2:0"),
        ("notice", f"{run.id}:2:0:undo"), ("notice", f"{run.id}:1:0:undo")]
    assert [r["to"] for kind, _, r in seen if kind == "notice"] == [
        "undo-o2@vendor.test", "undo-o1@vendor.test"]
    assert vendor.client.stats()["duplicates"] == 0
    effects = {e.key: e for e in aw.effects(run.id)}
    # The first undo was begun, killed, retried after the dropped reply, and finished.
    assert effects[f"{run.id}:2:0:undo"].attempts >= 3
    ledger = {k: e.status for k, e in effects.items()}
    assert ledger == {f"{run.id}:1:0": "compensated", f"{run.id}:2:0": "compensated",
                      f"{run.id}:1:0:undo": "applied", f"{run.id}:2:0:undo": "applied"}


def test_repeated_kills_never_overspend_the_budget(aw: AgentWorker, fleet: Fleet) -> None:
    """Three runs, each stopped by a different limit, while pool children are
    SIGKILLed after the model output is journaled (15 of the 18 first attempts,
    so each run dies at least three times) and after commits: every limit holds
    to within one lap's worth, and no lap is charged twice."""
    fleet.worker(concurrency=2, AGENT_WORKER_FAULTS="after_model_journal*15,after_commit*3")
    fleet.beat()
    lap_in, lap_cost = 100, Decimal("0.00014")
    by_laps = aw.start_run("loop", {"laps": 30}, budget=Budget(max_laps=6)).id
    by_tokens = aw.start_run("loop", {"laps": 30}, budget=Budget(max_input_tokens=550)).id
    by_cost = aw.start_run("priced-loop", {"laps": 30},
                           budget=Budget(max_cost=Decimal("0.0008"))).id
    finished = {rid: aw.wait(rid, timeout=200) for rid in (by_laps, by_tokens, by_cost)}
    for rid, run in finished.items():
        assert run.status == "failed" and run.error_code == "budget_exceeded", (
            rid, run.status, run.error_message)
        _assert_laps_once(aw, rid, run.lap)
        # One journaled model output per charged lap: a replay charged nothing new.
        assistants = [m for m in aw.messages(rid) if m.message.role == "assistant"]
        assert run.laps_used == run.lap == len(assistants)
        assert run.input_tokens == lap_in * run.laps_used
    assert finished[by_laps].laps_used == 6
    assert 550 <= finished[by_tokens].input_tokens < 550 + lap_in
    assert Decimal("0.0008") <= aw.cost(finished[by_cost]) < Decimal("0.0008") + lap_cost
    faults = Path(fleet.env["AGENT_WORKER_FAULT_DIR"])
    assert len(list(faults.glob("after_model_journal.*"))) == 15
    assert len(list(faults.glob("after_commit.*"))) == 3
    # A lap killed after its model step commits on a later attempt.
    killed = {rid: sum(1 for e in aw.events(rid) if e.kind == "lap_committed"
                       and e.data and e.data["attempt"] > 1) for rid in finished}
    assert sum(killed.values()) == 15 and min(killed.values()) >= 3, killed


def _rss_kib(worker: Proc) -> int:
    """Resident memory of a worker: its main process and its pool children."""
    total = 0
    for pid in (worker.pid, *worker.children()):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except FileNotFoundError:
            continue
    return total


def _count(aw: AgentWorker, ids: list[str], status: str) -> int:
    store = aw.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        return int(c.execute(select(func.count()).select_from(runs).where(
            runs.c.id.in_(ids), runs.c.status == status, runs.c.lease_owner.is_(None)))
            .scalar_one())


def _broker_backlog(url: str) -> tuple[int, int]:
    """(lap messages queued, messages delivered but not acked) in the broker."""
    r = redis.Redis.from_url(url)
    try:
        # kombu keeps one list per queue and priority ("laps.<agent>.v<n>[\x06\x16<p>]").
        queued = 0
        for key in r.scan_iter(match="laps.*"):
            queued += r.llen(key)
        return queued, r.hlen("unacked")
    finally:
        r.close()


def test_a_thousand_paused_runs_hold_no_worker(aw: AgentWorker, fleet: Fleet,
                                               broker_url: str) -> None:
    # Earlier tests of this session SIGKILLed workers on this Redis database; their
    # unacked messages would sit in the broker for the visibility timeout.
    r = redis.Redis.from_url(broker_url)
    r.flushdb()
    r.close()
    worker = fleet.worker(concurrency=2)
    sleep_a_year = _plan(["sleep", {"seconds": YEAR}])

    def start(n: int) -> list[str]:
        return [aw.start_run("pauses", sleep_a_year).id for _ in range(n)]

    warm = start(20)
    wait_for(lambda: _count(aw, warm, "sleeping") == 20, timeout=90, what="warm-up runs")
    wait_for(lambda: _broker_backlog(broker_url) == (0, 0), timeout=30, what="idle broker")
    before = _rss_kib(worker)

    ids = start(1000)
    wait_for(lambda: _count(aw, ids, "sleeping") == 1000, timeout=240, interval=1.0,
             what="1000 runs asleep")
    # Every lap message was consumed and acked: no Celery message holds a pause.
    wait_for(lambda: _broker_backlog(broker_url) == (0, 0), timeout=30, what="idle broker")
    after = _rss_kib(worker)
    assert after - before < 16 * 1024, f"worker RSS grew {before} -> {after} KiB"

    # Both pool slots are free: a new run goes straight through.
    quick = aw.start_run("loop", {"laps": 3})
    assert aw.wait(quick.id, timeout=60).status == "succeeded"
    assert _count(aw, ids, "sleeping") == 1000
