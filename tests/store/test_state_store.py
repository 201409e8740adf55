"""The store's side of operators' state edits on both dialects: an edit is applied by
exactly one fenced commit (a second application rolls that commit back,
nothing half-written), a commit that fails its fence applies nothing, and a
claim loads exactly the edits still pending."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent_worker.core.errors import InvalidStateError
from agent_worker.core.messages import Message
from agent_worker.store.base import LapCommit, RunUpdate
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from tests.store.test_conformance import NOW, _new


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    url = (f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite"
           else request.getfixturevalue("database_url"))
    upgrade(url)
    s = SqlStore(url)
    yield s
    s.dispose()


def _lap(rid: str, lap: int, owner: str, edits: list[int]) -> LapCommit:
    return LapCommit(
        run_id=rid, lap=lap, owner=owner,
        messages=[(lap, Message(role="assistant", content=f"lap {lap}"))],
        checkpoint={"schema_version": 2, "message_count": lap + 1}, schema_version=2,
        update=RunUpdate(status="queued", enqueue=True), usage=(lap, 0, 0, 0), event={},
        now=NOW, applied_edits=edits)


def test_an_edit_is_applied_by_one_fenced_commit_only(store: SqlStore) -> None:
    rid = f"edits-{uuid.uuid4().hex[:8]}"
    store.create_run(_new(rid))
    edit = store.request_state_edit(rid, {"note": "hi"}, by="ops", now=NOW)
    claim = store.claim(rid, 1, owner="a", now=NOW, lease_seconds=30, window_messages=10)
    assert claim is not None and [e.id for e in claim.state_edits] == [edit.id]
    assert not store.commit_lap(_lap(rid, 1, "b", [edit.id])), "fenced: not the owner"
    state = store.run_state(rid)
    assert state is not None and state.pending_edits == 1, "a failed fence applies nothing"
    assert store.commit_lap(_lap(rid, 1, "a", [edit.id]))
    state = store.run_state(rid)
    assert state is not None and (state.pending_edits, state.run.next_lap) == (0, 2)
    assert state.checkpoint["message_count"] == 2, "the committed lap's checkpoint"
    claim = store.claim(rid, 2, owner="a", now=NOW, lease_seconds=30, window_messages=10)
    assert claim is not None and claim.state_edits == []
    with pytest.raises(InvalidStateError, match="already applied"):
        store.commit_lap(_lap(rid, 2, "a", [edit.id]))
    after = store.run_state(rid)
    assert after is not None and after.run.next_lap == 2, "the whole commit rolled back"
    assert [e.kind for e in store.list_events(rid)].count("state_updated") == 1
    assert store.commit_lap(replace(_lap(rid, 2, "a", []), update=RunUpdate(status="succeeded")))
    with pytest.raises(InvalidStateError, match="succeeded"):
        store.request_state_edit(rid, {"note": "late"}, by="ops", now=NOW)
    assert store.run_state("nope") is None
