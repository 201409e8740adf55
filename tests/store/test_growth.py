"""Per-lap cost stays flat however long the run: a lap writes only its own
messages, a small checkpoint and one event (no full-history blob)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from agent_worker import Agent, Budget, InProcessWorker, ScriptedModel, register, tool, turn
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.store.sql import SqlStore
from tests.store_helpers import delete_run


@tool
def noop(n: int) -> str:
    """Returns about 400 bytes."""
    return "r" * 400


def _script(r: ModelRequest) -> ModelResponse:
    if r.lap > 200:
        return turn("finished")
    return turn("a" * 600, [("noop", {"n": r.lap})])


@pytest.fixture
def long_run(database_url: str) -> Iterator[tuple[InProcessWorker, str]]:
    register(Agent(name="growth", model=ScriptedModel(_script), tools=[noop],
                   window_messages=40, budget=Budget(max_laps=None)))
    w = InProcessWorker(database_url)
    run = w.start_run("growth", "go")
    w.run_until_idle()
    assert w.get_run(run.id).status == "succeeded"
    yield w, run.id
    assert isinstance(w.rt.store, SqlStore)
    delete_run(w.rt.store, run.id)
    w.rt.store.dispose()


def lap_bytes(store: SqlStore, run_id: str, lap: int) -> int:
    """Bytes of every row lap ``lap`` wrote (messages, checkpoint, events, effects)."""
    q = text("""
        SELECT (SELECT coalesce(sum(pg_column_size(m.*)), 0) FROM messages m
                 WHERE run_id = :r AND lap = :l)
             + (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM checkpoints c
                 WHERE run_id = :r AND lap = :l)
             + (SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM events e
                 WHERE run_id = :r AND lap = :l)
             + (SELECT coalesce(sum(pg_column_size(f.*)), 0) FROM effects f
                 WHERE run_id = :r AND lap = :l)""")
    with store.engine.connect() as c:
        return int(c.execute(q, {"r": run_id, "l": lap}).scalar_one())


def test_lap_200_writes_about_what_lap_10_writes(long_run: tuple[InProcessWorker, str]) -> None:
    w, run_id = long_run
    store = w.rt.store
    assert isinstance(store, SqlStore)
    early, late = lap_bytes(store, run_id, 10), lap_bytes(store, run_id, 200)
    assert early > 1000  # the ~600 + ~400 bytes of messages are really there
    assert abs(late - early) / early < 0.05, (early, late)


def test_claim_reads_only_the_window(long_run: tuple[InProcessWorker, str]) -> None:
    from datetime import UTC, datetime

    w, run_id = long_run
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:  # reopen the finished run at its last lap for a claim
        c.execute(text("UPDATE runs SET status='queued', next_lap=200, lease_owner=NULL "
                       "WHERE id=:r"), {"r": run_id})
    claim = store.claim(run_id, 200, owner="probe", now=datetime.now(UTC), lease_seconds=5,
                        window_messages=40)
    assert claim is not None
    assert len(claim.window) <= 40
    assert claim.window[-1].seq == claim.checkpoint["message_count"] - 1
