"""The run page's timeline on Postgres: each gap between laps is labelled by
the cause the store's records give it (a lease the sweeper recovered after
its worker died, a wait for an approval, a failed attempt and its backoff, a
wait for a fair-share slot, plain queueing), with the times the records say;
the drawing's causes are the derivation's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from agent_worker.agent import Agent
from agent_worker.console import timeline
from agent_worker.console.app import create_app
from agent_worker.console.users import UserBook
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.store import runpanels
from agent_worker.store.base import EventRecord
from agent_worker.store.sql import SqlStore
from tests.conftest import DatabaseClock, LockstepClock
from tests.console.agents import registry
from tests.console.conftest import PASSWORD, csrf_of
from tests.principals import acting

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock(own_database_url: str) -> Iterator[LockstepClock]:
    """The worker's clock, which the test database's follows (leases and the
    sweeper read the database's)."""
    database = DatabaseClock(own_database_url)
    yield LockstepClock(T0, database)
    database.reset()


@pytest.fixture
def pg(own_database_url: str, clock: LockstepClock) -> Iterator[InProcessWorker]:
    """An in-process worker on a Postgres database of the test's own."""
    w = InProcessWorker(own_database_url, clock=clock, retry_backoff_seconds=0,
                        max_lap_attempts=3)
    w.rt.registry = registry()
    yield w
    w.close()


def _rows(w: InProcessWorker, run_id: str) -> list[timeline.Row]:
    run = w.get_run(run_id)
    store = w.rt.store
    assert isinstance(store, SqlStore)
    commits = [e for e in w.events(run_id) if e.kind == "lap_committed"]
    gaps = runpanels.gap_events(store, run_id, first=1, last=run.lap, until=None)
    return timeline.rows(run, commits, gaps, w.rt.clock.now())


def _causes(row: timeline.Row) -> list[str]:
    return [s.cause for s in row.gap]


def test_a_dead_workers_lease_is_the_gap_before_the_lap_it_was_running(
        pg: InProcessWorker, clock: LockstepClock) -> None:
    run = acting(pg, "app", "submitter", tenant="acme").start_run("console-xss", "go")
    # A worker claims lap 1 and dies: no commit, no release; only its lease is left.
    claim = pg.rt.store.claim(run.id, 1, owner="dead-host:1:x", now=clock.now(),
                              lease_seconds=30, window_messages=40,
                              served=["console-xss@1"])
    assert claim is not None
    pg.queue.pending.clear()  # the message went with it (Redis re-delivers it an hour on)
    clock.advance(seconds=45)  # the lease ran out 15 s ago
    pg.run_until_idle()  # the sweep recovers it; this worker runs the laps
    done = pg.get_run(run.id)
    assert done.status == "succeeded" and done.recoveries == 1
    first, second = _rows(pg, run.id)
    assert first.lap == 1 and first.attempt == 2
    assert first.cause == "recovered" and _causes(first)[0] == "recovered"
    recovered = first.gap[0]
    assert recovered.start == run.created_at
    assert recovered.ms == pytest.approx(45_000, abs=1)  # dead lap + lease expiry, to the sweep
    assert second.cause == "queued" and second.attempt == 1


def test_a_wait_for_approval_is_the_gap_until_the_decision(
        pg: InProcessWorker, clock: LockstepClock) -> None:
    app = acting(pg, "app", "submitter", tenant="acme")
    run = app.start_run("refunds", "go")
    pg.run_until_idle()
    assert pg.get_run(run.id).status == "waiting"
    rows = _rows(pg, run.id)
    assert rows[-1].commit is None and rows[-1].cause == "approval"  # the wait it is in now
    clock.advance(minutes=7)
    (pending,) = app.list_approvals(run_id=run.id)
    acting(pg, "alice", "approver", tenant="acme").approve(pending.id, comment="ok")
    pg.run_until_idle()
    rows = _rows(pg, run.id)
    assert [r.lap for r in rows] == [1, 2, 3, 4]  # lap 3 runs the approved call alone
    assert rows[2].cause == "approval"
    approval = next(s for s in rows[2].gap if s.cause == "approval")
    assert approval.ms == pytest.approx(7 * 60_000, abs=1)
    commits = [e for e in pg.events(run.id) if e.kind == "lap_committed"]
    assert approval.start == commits[1].created_at  # lap 2's commit paused the run
    # Windows of two laps, as pages of two: the newer page's first gap starts at
    # the commit before it; the older page ends at its last commit, the
    # decision that came after it is the newer page's.
    store = pg.rt.store
    assert isinstance(store, SqlStore)
    run_now = pg.get_run(run.id)
    newer = timeline.rows(run_now, commits[2:], runpanels.gap_events(
        store, run.id, first=3, last=4, until=None), clock.now())
    assert [(r.lap, r.cause) for r in newer] == [(3, "approval"), (4, "queued")]
    assert newer[0].gap[0].start == commits[1].created_at
    older_gaps = runpanels.gap_events(store, run.id, first=1, last=2,
                                      until=commits[1].created_at)
    assert "approval_decided" not in [e.kind for e in older_gaps.events]
    older = timeline.rows(run_now, commits[:2], older_gaps, clock.now())
    assert [(r.lap, r.cause) for r in older] == [(1, "queued"), (2, "queued")]


def test_a_failed_attempt_then_its_backoff(pg: InProcessWorker,
                                           clock: LockstepClock) -> None:
    run = acting(pg, "app", "submitter", tenant="acme").start_run("flaky", "go")
    pg.run_until_idle()
    (row,) = _rows(pg, run.id)
    assert row.attempt == 2
    assert _causes(row)[:2] == ["failed", "backoff"]
    retry = next(e for e in pg.events(run.id) if e.kind == "retry")
    assert row.gap[0].end == retry.created_at


def test_a_wait_for_a_fair_share_slot_ends_where_admission_let_it_go(
        pg: InProcessWorker, clock: LockstepClock) -> None:
    """One slot for the agent: the second run waits in Postgres until the
    first one's lap commits; admission records when it let the second go."""
    pg.rt.registry.register(Agent(name="one-slot", model=lambda: ScriptedModel(
        lambda r: turn("done")), concurrency=1))
    app = acting(pg, "app", "submitter", tenant="acme")
    first, second = app.start_run("one-slot", "a"), app.start_run("one-slot", "b")
    assert pg.get_run(second.id).admitted_lap == -1  # throttled: no message was sent
    clock.advance(seconds=20)
    pg.run_until_idle()
    assert [e.kind for e in pg.events(first.id)].count("admitted") == 0  # admitted as it asked
    (row,) = _rows(pg, second.id)
    assert row.cause == "throttled"
    assert row.gap[0].cause == "throttled" and row.gap[0].ms == pytest.approx(20_000, abs=1)


def test_gap_causes_from_the_events_alone() -> None:
    """The walk itself, on records written by hand: a wait for a slot, a
    timer's wake-up, a signal, plain queueing."""
    at = T0

    def ev(kind: str, seconds: float, **data: object) -> EventRecord:
        return EventRecord(1, "r", None, kind, dict(data) or None, at + timedelta(seconds=seconds))

    throttled = timeline.GapCause("queued", at)
    throttled.see(ev("admitted", 30))
    segments = throttled.end(at + timedelta(seconds=31))
    assert [(s.cause, s.ms) for s in segments] == [("throttled", 30_000), ("queued", 1000)]
    assert timeline.main_cause(segments) == "throttled"

    timer = timeline.GapCause("timer", at)
    timer.see(ev("woken", 600))
    assert timeline.main_cause(timer.end(at + timedelta(seconds=601))) == "timer"

    signal = timeline.GapCause("waiting", at)
    signal.see(ev("signal_received", 5, name="go"))
    signal.see(ev("woken", 5, arrived="signal:go"))
    assert [s.cause for s in signal.end(at + timedelta(seconds=6))] == ["signal", "queued"]

    plain = timeline.GapCause("queued", at)
    assert timeline.main_cause(plain.end(at + timedelta(milliseconds=8))) == "queued"


def test_the_page_draws_the_derived_causes(pg: InProcessWorker, clock: LockstepClock,
                                           users: UserBook) -> None:
    run = acting(pg, "app", "submitter", tenant="acme").start_run("console-xss", "go")
    pg.rt.store.claim(run.id, 1, owner="dead-host:1:y", now=clock.now(), lease_seconds=30,
                      window_messages=40, served=["console-xss@1"])
    pg.queue.pending.clear()
    clock.advance(seconds=45)
    pg.run_until_idle()
    browser = TestClient(create_app(pg, users=users), follow_redirects=False)
    form = browser.get("/login")
    browser.post("/login", data={"username": "bob", "password": PASSWORD,
                                 "csrf_token": csrf_of(form.text)})
    page = browser.get(f"/runs/{run.id}").text
    drawn = dict(re.findall(r'class="tl-row" data-lap="(\d+)" data-cause="(\w+)"', page))
    assert drawn == {"1": "recovered", "2": "queued"}
    assert "lease expired, recovered" in page and 'href="#lap-1"' in page
    assert 'id="lap-1"' in page  # the row a click lands on: the lap's calls and effects
    # A page of one lap: the timeline draws the laps page's window alone.
    small = pg.rt.settings.model_copy(update={"console_page_size": 1})
    paged = TestClient(create_app(pg, users=users, settings=small), follow_redirects=False)
    form = paged.get("/login")
    paged.post("/login", data={"username": "bob", "password": PASSWORD,
                               "csrf_token": csrf_of(form.text)})
    newest = paged.get(f"/runs/{run.id}").text
    assert re.findall(r'class="tl-row" data-lap="(\d+)"', newest) == ["2"]
    assert 'id="timeline-older"' in newest and 'id="timeline-newer"' not in newest
    oldest = paged.get(f"/runs/{run.id}?laps=2").text
    assert dict(re.findall(r'class="tl-row" data-lap="(\d+)" data-cause="(\w+)"', oldest)) == {
        "1": "recovered"}
