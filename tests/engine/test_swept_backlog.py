"""``swept`` (tests/engine/conftest.py) is how engine tests sweep a database
other tests' leftovers share: it must find a test's own due run however many
leftovers fall due with it. One sweep pass picks at most 500 laps of a kind
(CI once failed a store test whose run missed the pass), so ``swept`` repeats passes
at the same instant until one sends nothing."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from agent_worker import InProcessWorker, ScriptedModel, turn
from agent_worker.agent import Agent, Registry
from agent_worker.store.base import Store
from agent_worker.store.sql import SqlStore
from tests.conftest import DatabaseClock
from tests.engine.conftest import OwnRunsWorker, swept
from tests.store import runs as runs_helper

NOW = datetime(2026, 12, 5, 15, 0, tzinfo=UTC)
PASS_LIMIT: int = inspect.signature(Store.sweep).parameters["limit"].default


@pytest.fixture
def crowded(own_database_url: str) -> Iterator[tuple[InProcessWorker, str, list[str]]]:
    """A worker on a database of its own (the leftovers made here must not
    crowd other tests), with more overdue hand-offs than one pass picks: the
    database's clock is an hour past their sends."""
    worker = OwnRunsWorker(own_database_url)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(name="crowd", version="1",
                                      model=ScriptedModel(lambda r: turn("done"))))
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    leftovers = [runs_helper.start(store, NOW, prefix="crowd") for _ in range(PASS_LIMIT + 20)]
    own = runs_helper.start(store, NOW, prefix="crowd")
    clock = DatabaseClock(own_database_url)
    clock.advance(hours=1)
    clock.engine.dispose()
    yield worker, own, leftovers
    store.dispose()


def test_a_run_behind_more_than_a_pass_of_leftovers_is_swept(
        crowded: tuple[InProcessWorker, str, list[str]]) -> None:
    worker, own, leftovers = crowded
    assert swept(worker, {own}) == [own]
    # Every leftover was sent too (and taken back off the queue): none is due
    # at this instant any more.
    assert swept(worker, set(leftovers)) == []
