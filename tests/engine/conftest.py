"""Engine tests run the in-process engine on both dialects: SQLite hides what
Postgres refuses (U+0000, lone surrogates, a commit's real fencing)."""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_worker.agent import Agent, Registry
from agent_worker.engine import heartbeat
from agent_worker.inprocess import InProcessWorker
from agent_worker.store.base import RunRecord

#: The threads alive when a test's body starts: those of broader fixtures
#: (a module's worker, a server) are not the test's to stop.
_CALL_THREADS = pytest.StashKey[set[threading.Thread]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    item.stash[_CALL_THREADS] = set(threading.enumerate())


@pytest.fixture(autouse=True)
def no_thread_left(request: pytest.FixtureRequest,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every thread a test's body starts has ended once its fixtures are torn
    down: idle threads piling up across a session (120 lease heartbeats, one
    per worker never closed) slowed a loaded machine until a test hit its
    timeout.

    The heartbeat of every runtime the test ran a lap on is stopped first,
    as ``Runtime.close()`` does (tests build many workers and close few), and
    the runtime forgets it, so a worker a later test shares starts a new one.
    Any other thread still alive a few seconds later fails the test."""
    beaters: list[Any] = []
    start = heartbeat._Beater.__init__

    def tracked(self: Any, rt: Any) -> None:
        start(self, rt)
        beaters.append(self)

    monkeypatch.setattr(heartbeat._Beater, "__init__", tracked)
    yield
    for beater in beaters:
        beater.stop()
        if beater.rt.heartbeat is beater:
            beater.rt.heartbeat = None
    before = request.node.stash.get(_CALL_THREADS, None)
    if before is None:  # the body never ran: its setup failed
        return
    left = [t for t in threading.enumerate() if t not in before]
    for t in left:  # one that is ending (a stopped wait) gets a moment
        t.join(timeout=5)
    alive = [t.name for t in left if t.is_alive()]
    assert not alive, f"threads left running by this test: {alive}"


@pytest.fixture(params=["sqlite", "postgres"])
def dialect_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, or this session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'aw.db'}"
    value: str = request.getfixturevalue("database_url")
    return value


@pytest.fixture
def bare_worker(dialect_url: str) -> Iterator[InProcessWorker]:
    """An in-process worker on ``dialect_url`` with a registry of its own (each
    test registers its agents), no retry backoff and three lap attempts."""
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    w.rt.registry = Registry()
    yield w
    w.close()


#: Passes ``swept`` makes at most: each sends at most 500 laps a kind.
SWEEP_PASSES = 20


def swept(w: InProcessWorker, ids: Container[str]) -> list[str]:
    """One sweep of ``w``; the runs among ``ids`` it sent a lap for, in order.

    The sweep is fleet-wide, and on Postgres the database is the whole test
    session's: a lap it sends for a run not in ``ids`` (another test's leftover)
    is taken back off ``w``'s queue, neither run nor counted. A pass picks at
    most 500 due laps of a kind, and the session's leftovers can outnumber
    that, so passes repeat at the same instant until one sends nothing: what
    one pass would send without the limit (a sent lap is marked sent, so no
    pass at the same instant sends it again). It calls
    ``InProcessWorker.sweep`` itself, so a worker whose ``sweep`` is this
    filter (``OwnRunsWorker``) does not recurse."""
    before = len(w.queue.pending)
    for _ in range(SWEEP_PASSES):
        if InProcessWorker.sweep(w) == 0:
            break
    else:
        raise AssertionError(f"still sending laps after {SWEEP_PASSES} sweep passes")
    sent = [w.queue.pending.pop() for _ in range(len(w.queue.pending) - before)][::-1]
    mine = [lap for lap in sent if lap.run_id in ids]
    w.queue.pending.extend(mine)
    return [lap.run_id for lap in mine]


class OwnRunsWorker(InProcessWorker):
    """An in-process worker that runs only its own test's runs (``runs``: every
    run it starts or forks, and any the test adds): its sweeps keep only their
    laps (``swept``), so ``run_until_idle()`` and ``sweep()`` count what the
    test did, on a database other tests' runs share too."""

    def __init__(self, database_url: str, runs: set[str] | None = None, **kw: Any) -> None:
        super().__init__(database_url, **kw)
        self.runs = set() if runs is None else runs

    def start_run(self, agent: str | Agent, input: Any = None, **kw: Any) -> RunRecord:
        run = super().start_run(agent, input, **kw)
        self.runs.add(run.id)
        return run

    def fork(self, run_id: str, lap: int, **kw: Any) -> RunRecord:
        run = super().fork(run_id, lap, **kw)
        self.runs.add(run.id)
        return run

    def sweep(self) -> int:
        """One sweep; how many laps it sent for this test's runs."""
        return len(swept(self, self.runs))
