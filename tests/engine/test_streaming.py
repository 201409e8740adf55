"""``stream(run_id, after=…)`` on both dialects: resume without gap or
duplicate, the end marker, a notification that wakes the reader at once, and
(Postgres) events of one run committed out of id order by concurrent
transactions, the case a cursor over a sequence would lose."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

import tests.agents  # noqa: F401  (registers the "loop" agent)
from agent_worker.core.errors import AgentWorkerError, InvalidInputError, UnknownRunError
from agent_worker.inprocess import InProcessWorker
from agent_worker.store.db import make_engine
from agent_worker.streaming import StreamEvent, follow


@pytest.fixture
def worker(dialect_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0)
    yield w
    w.run_until_idle()  # no run left queued on the shared database for later tests' sweeps
    w.close()


def _ids(events: list[StreamEvent]) -> list[int]:
    return [e.id for e in events if e.kind != "end"]


def test_reconnects_see_every_event_once_in_order(worker: InProcessWorker) -> None:
    run = worker.start_run("loop", {"laps": 6}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    seen: list[StreamEvent] = []
    after = 0
    errors: list[BaseException] = []

    def client() -> None:
        nonlocal after
        try:
            for take in (2, 3, 4, 10_000):  # three disconnects, then to the end
                for event in worker.stream(run.id, after=after, poll_seconds=0.05):
                    seen.append(event)
                    after = event.id
                    if event.kind == "end" or len(seen) % take == 0:
                        break
                if seen and seen[-1].kind == "end":
                    return
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    reader = threading.Thread(target=client)
    reader.start()
    while worker.queue.pending:  # laps commit while the client reads and reconnects
        worker.run_until_idle(max_laps=1)
        time.sleep(0.02)
    reader.join(30)
    assert not errors and not reader.is_alive()
    stored = [e.id for e in worker.events(run.id)]
    assert _ids(seen) == stored  # every stored event once, in order
    assert seen[-1].kind == "end" and seen[-1].data and seen[-1].data["status"] == "succeeded"
    commits = [e for e in seen if e.kind == "lap_committed"]
    assert [e.lap for e in commits] == [1, 2, 3, 4, 5, 6]
    first = commits[0]
    assert [m.role for m in first.messages] == ["assistant", "tool"]
    assert first.messages[0].tool_calls[0].name == "step"


def test_resume_after_an_id_yields_exactly_the_rest(worker: InProcessWorker) -> None:
    run = worker.start_run("loop", {"laps": 3}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    worker.run_until_idle()
    stored = [e.id for e in worker.events(run.id)]
    middle = stored[len(stored) // 2]
    rest = list(worker.stream(run.id, after=middle))
    assert _ids(rest) == [i for i in stored if i > middle]
    again = list(worker.stream(run.id, after=stored[-1]))
    assert [e.kind for e in again] == ["end"] and again[0].id == stored[-1]


def test_bad_resume_points_and_unknown_runs_are_refused(worker: InProcessWorker) -> None:
    run = worker.start_run("loop", {"laps": 1}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    for after in (-1, "x", "1e3", True, "\u0663", 2 ** 63, 1.5):
        with pytest.raises(InvalidInputError):
            worker.stream(run.id, after=after)  # type: ignore[arg-type]
    with pytest.raises(UnknownRunError):
        worker.stream("no-such-run")


HOSTILE_RUN_IDS: dict[str, Callable[[], str]] = {
    "nul": lambda: "a\x00b", "lone-surrogate": lambda: "\ud800",
    "30mb": lambda: "r" * (30 * 2 ** 20), "empty": lambda: "", "nested": lambda: "[" * 5000}


@pytest.mark.parametrize("kind", list(HOSTILE_RUN_IDS))
def test_a_hostile_run_id_is_refused_before_anyone_follows_it(
        worker: InProcessWorker, dialect_url: str, kind: str) -> None:
    """``follow`` reads the run before it subscribes or registers as a
    follower (``0023_notify_followed``), so garbage never reaches either.
    (Built in the test: a 30 MB parameter would be the test's id.)"""
    run_id = HOSTILE_RUN_IDS[kind]()
    with pytest.raises(AgentWorkerError):
        next(follow(worker, run_id, poll_seconds=0.05))
    if dialect_url.startswith("postgresql"):
        engine = make_engine(dialect_url)
        try:
            with engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM event_followers WHERE "
                                      "length(run_id) > 1000 OR run_id = '' OR "
                                      "run_id LIKE '[[[%'")).scalar_one() == 0
        finally:
            engine.dispose()


def test_a_commit_wakes_the_reader_without_waiting_for_the_poll(
        worker: InProcessWorker, dialect_url: str) -> None:
    if not dialect_url.startswith("postgresql"):
        pytest.skip("SQLite has no notification channel: its readers poll")
    run = worker.start_run("loop", {"laps": 1}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    events = follow(worker, run.id, after=worker.events(run.id)[-1].id, poll_seconds=30)
    got: list[float] = []
    reader = threading.Thread(target=lambda: got.append(
        time.monotonic() if next(events) is not None else 0.0))
    reader.start()
    time.sleep(0.5)  # the reader is waiting on its channel
    sent = time.monotonic()
    worker.rt.store.record_event(run.id, None, "probe", {}, now=worker.rt.clock.now())
    reader.join(10)
    assert got and got[0] - sent < 2.0  # woken by NOTIFY, not by the 30 s poll
    events.close()


def test_events_committed_out_of_id_order_are_not_skipped(
        worker: InProcessWorker, dialect_url: str) -> None:
    """Transaction A writes an event of the run and stays open; B writes one
    and commits; then A commits. Drawn from a plain sequence, B's id would be
    larger and visible first, and a reader that moved past it would never see
    A's. The trigger of migration 0006 numbers a run's events under its row
    lock, so B waits for A and the cursor sees both."""
    if not dialect_url.startswith("postgresql"):
        pytest.skip("SQLite admits one writer at a time")
    run = worker.start_run("loop", {"laps": 1}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    cursor = worker.events(run.id)[-1].id
    engine = make_engine(dialect_url)  # the workers' system scope (row-level security)
    insert = text("INSERT INTO events (run_id, lap, kind, data, created_at) "
                  "VALUES (:r, NULL, :k, NULL, now())")
    seen: list[int] = []

    def read() -> None:
        nonlocal cursor
        for e in worker.events(run.id, after_id=cursor):
            seen.append(e.id)
            cursor = e.id

    try:
        with engine.connect() as a:
            a.execute(insert, {"r": run.id, "k": "first"})
            b = threading.Thread(target=lambda: worker.rt.store.record_event(
                run.id, None, "second", {}, now=worker.rt.clock.now()))
            b.start()
            time.sleep(0.5)
            read()  # B must not be visible (committed) ahead of A
            a.commit()
        b.join(10)
        read()
    finally:
        engine.dispose()
    kinds = {e.id: e.kind for e in worker.events(run.id)}
    assert [kinds[i] for i in seen] == ["first", "second"]


def test_cli_follow_prints_the_stream_and_resumes(worker: InProcessWorker) -> None:
    """``runs follow`` prints one JSON line per event, ending with ``end``;
    ``--after`` resumes; a bad ``--after`` exits 2 (bad input)."""
    import json

    from typer.testing import CliRunner

    import agent_worker.api as api
    from agent_worker.cli import app, main

    run = worker.start_run("loop", {"laps": 2}, run_id=f"s-{uuid.uuid4().hex[:8]}")
    worker.run_until_idle()
    api.configure(worker)
    try:
        cli = CliRunner()
        out = cli.invoke(app, ["runs", "follow", run.id, "--json"])
        assert out.exit_code == 0, out.output
        lines = [json.loads(line) for line in out.output.splitlines()]
        assert [e["kind"] for e in lines] == ["run_created", "lap_committed", "lap_committed",
                                              "end"]
        assert lines[1]["messages"][0]["tool_calls"][0]["name"] == "step"
        again = cli.invoke(app, ["runs", "follow", run.id, "--json", "--after",
                                 str(lines[1]["id"])])
        assert [json.loads(x)["kind"] for x in again.output.splitlines()] == [
            "lap_committed", "end"]
        assert main(["runs", "follow", run.id, "--after", "-3"]) == 2  # bad input
        assert main(["runs", "follow", "no-such-run"]) == 3  # not found
    finally:
        api.configure(None)
