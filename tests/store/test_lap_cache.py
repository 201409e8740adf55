"""The claim after this process's own commit (``store.lapcache``): it reads
no window back, hands the lap exactly what a full read would, and reads
everything again whenever anything was written since (another worker's
attempt, an operator's edit, a release), on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from agent_worker.core.messages import Message
from agent_worker.store.base import Claim, LapCommit, NewRun, RunUpdate
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore

NOW = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
WINDOW = 3


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        value = f"sqlite:///{tmp_path / 'cache.db'}"
        upgrade(value)
        return value
    found: str = request.getfixturevalue("database_url")
    return found


@pytest.fixture
def stores(url: str) -> Iterator[tuple[SqlStore, SqlStore]]:
    """Two stores on one database: this process and another worker."""
    a, b = SqlStore(url), SqlStore(url)
    yield a, b
    a.dispose()
    b.dispose()


class Reads:
    """Counts the window reads and edit reads ``store`` sends."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.window = self.edits = 0
        event.listen(Engine, "before_cursor_execute", self._seen)

    def reset(self) -> None:
        self.window = self.edits = 0

    def close(self) -> None:
        event.remove(Engine, "before_cursor_execute", self._seen)

    def _ours(self, engine: Engine) -> bool:
        # The lap's reads go through the store's relaxed-durability engine on Postgres.
        return engine in (self.store.engine, self.store._relaxed)

    def _seen(self, conn: Connection, cursor: Any, statement: str, *_: Any) -> None:
        if not self._ours(conn.engine):
            return
        if statement.startswith("SELECT messages.seq") and "AS body" in statement:
            self.window += 1
        if statement.lstrip().startswith("SELECT state_edits"):
            self.edits += 1


@pytest.fixture
def reads(stores: tuple[SqlStore, SqlStore]) -> Iterator[Reads]:
    """What the first store (this process) reads from here on."""
    counted = Reads(stores[0])
    yield counted
    counted.close()


def _rid(name: str) -> str:
    import uuid

    return f"{name}-{uuid.uuid4().hex[:8]}"


def _start(store: SqlStore, rid: str) -> None:
    store.create_run(NewRun(
        id=rid, tenant="t1", agent_name="a", agent_version="1", input={}, limits={},
        retention="full", checkpoint={"schema_version": 2, "message_count": 1},
        schema_version=2, messages=[Message(role="user", content="task")], now=NOW))


def _claim(store: SqlStore, rid: str, lap: int, owner: str) -> Claim:
    got = store.claim(rid, lap, owner=owner, now=NOW, lease_seconds=60,
                      window_messages=WINDOW)
    assert got is not None
    return got


def _commit(store: SqlStore, claim: Claim, *, summary: bool = False,
            pending: list[dict[str, Any]] | None = None) -> None:
    """Lap ``claim.lap`` writes an assistant message and a tool result (and,
    with ``summary``, a summary message it then keeps in every window)."""
    count = int(claim.checkpoint["message_count"])
    new = [Message(role="assistant", content=f"lap {claim.lap}", meta={"n": claim.lap}),
           Message(role="tool", content=f"result {claim.lap}", tool_call_id="c")]
    state: dict[str, Any] = {**claim.checkpoint, "message_count": count + len(new),
                             "lap": claim.lap, "pending_calls": pending or []}
    if summary:
        new.append(Message(role="user", content=f"summary to {count}"))
        state.update(message_count=count + 3, summary_seq=count + 2)
    assert store.commit_lap(LapCommit(
        run_id=claim.run.id, lap=claim.lap, owner=claim.owner,
        messages=[(count + i, m) for i, m in enumerate(new)], checkpoint=state,
        schema_version=2, update=RunUpdate(status="queued", enqueue=True),
        usage=(claim.lap, 0, 0, 0), event={}, now=NOW))


def _after_lap_one(store: SqlStore, name: str) -> str:
    """A new run whose lap 1 ``store`` claimed and committed."""
    rid = _rid(name)
    _start(store, rid)
    _commit(store, _claim(store, rid, 1, "a1"))
    return rid


def _same(cached: Claim, full: Claim) -> None:
    assert cached.checkpoint == full.checkpoint
    assert [(m.seq, m.lap, m.message) for m in cached.window] == [
        (m.seq, m.lap, m.message) for m in full.window]
    assert cached.lap_messages == full.lap_messages and cached.effects == full.effects
    assert [e.id for e in cached.state_edits] == [e.id for e in full.state_edits]


def test_the_next_claim_reads_nothing_back_and_equals_a_full_read(
        stores: tuple[SqlStore, SqlStore], reads: Reads) -> None:
    a, b = stores
    rid = _rid("hit")
    _start(a, rid)
    reads.reset()
    claim = _claim(a, rid, 1, "a1")
    for lap in range(1, 6):
        _commit(a, claim, summary=lap == 2)
        before = reads.window
        claim = _claim(a, rid, lap + 1, f"a{lap + 1}")
        assert reads.window == before, "the window was read back"
        # Another store re-claiming as the same attempt reads the database.
        _same(claim, _claim(b, rid, lap + 1, f"a{lap + 1}"))
    assert reads.edits == 0
    assert claim.checkpoint["summary_seq"] == 5 and claim.window[0].seq == 5
    assert len(claim.window) == WINDOW + 1


def test_another_attempts_journaled_output_is_replayed_not_forgotten(
        stores: tuple[SqlStore, SqlStore], reads: Reads) -> None:
    """This process committed lap 1; another worker's attempt of lap 2
    journaled its model output, then gave the lap back. This process's claim
    of lap 2 must return that output (to replay it), not its cached view."""
    a, b = stores
    rid = _after_lap_one(a, "replay")
    theirs = _claim(b, rid, 2, "b2")
    said = Message(role="assistant", content="journaled by b")
    b.journal_model_output(rid, 2, owner="b2", seq=3, message=said, now=NOW)
    assert b.release(rid, 2, owner="b2", now=NOW, event={},
                     outcome=RunUpdate(status="queued", enqueue=True))
    reads.reset()
    ours = _claim(a, rid, 2, "a2")
    assert reads.window == 1
    assert [m.message.content for m in ours.lap_messages] == ["journaled by b"]
    _same(ours, _claim(b, rid, 2, "a2"))
    assert theirs.checkpoint == ours.checkpoint


def test_a_lap_committed_elsewhere_is_read_from_the_database(
        stores: tuple[SqlStore, SqlStore], reads: Reads) -> None:
    a, b = stores
    rid = _after_lap_one(a, "moved")
    _commit(b, _claim(b, rid, 2, "b2"))  # a redelivered lap ran on another worker
    reads.reset()
    ours = _claim(a, rid, 3, "a3")
    assert reads.window == 1 and ours.checkpoint["lap"] == 2
    assert [m.message.content for m in ours.window][-2:] == ["lap 2", "result 2"]


def test_an_operators_edit_reaches_a_cached_claim(
        stores: tuple[SqlStore, SqlStore], reads: Reads) -> None:
    a, b = stores
    rid = _after_lap_one(a, "edit")
    edit = b.request_state_edit(rid, {"note": "stop after this"}, by="op", now=NOW)
    reads.reset()
    ours = _claim(a, rid, 2, "a2")
    assert reads.window == 0 and reads.edits == 1
    assert [e.id for e in ours.state_edits] == [edit.id]
    _same(ours, _claim(b, rid, 2, "a2"))


def test_a_released_lap_and_pending_calls_read_everything_again(
        stores: tuple[SqlStore, SqlStore], reads: Reads) -> None:
    a, _ = stores
    rid = _after_lap_one(a, "release")
    reads.reset()
    assert a.release(rid, 2, owner=_claim(a, rid, 2, "a2").owner, now=NOW, event={},
                     outcome=RunUpdate(status="queued", enqueue=True))
    assert reads.window == 0
    _commit(a, _claim(a, rid, 2, "a2b"), pending=[{"lap": 2, "index": 1}])
    assert reads.window == 1  # the release: the retry reads the database
    _claim(a, rid, 3, "a3")
    assert reads.window == 2  # calls left pending: their ledger rows are read
