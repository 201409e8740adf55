"""``AgentWorker.search_runs(text=...)`` and its order, on SQLite and
Postgres: a term finds runs by id prefix, agent, label value and error text;
``%``, ``_`` and backslashes are plain characters; what could never be stored
(U+0000, a lone surrogate) matches nothing; an over-long term is refused; a
page reads a bounded window and its cursor goes on past it; another tenant's
runs are never found; oldest-first pages walk the same runs the other way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker import InProcessWorker
from agent_worker.agent import Agent, Registry
from agent_worker.core.errors import InvalidInputError, ModelRefusalError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.core.principal import Principal
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.store import listing
from agent_worker.store.sql import SqlStore

#: An error text full of what LIKE would otherwise read as patterns.
ERROR = r"quota 100%_used at C:\tmp\x"


def _refuse(r: ModelRequest) -> ModelResponse:
    raise ModelRefusalError(ERROR)


@pytest.fixture(params=["sqlite", "postgres"])
def w(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InProcessWorker]:
    url = (f"sqlite:///{tmp_path / 'search.db'}" if request.param == "sqlite"
           else request.getfixturevalue("database_url"))
    worker = InProcessWorker(url, retry_backoff_seconds=0, max_lap_attempts=1)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(name="finder", model=ScriptedModel(
        lambda r: turn("done"))))
    worker.rt.registry.register(Agent(name="refuser", model=ScriptedModel(_refuse)))
    yield worker
    assert isinstance(worker.rt.store, SqlStore)
    worker.close()


def _as(w: InProcessWorker, tenant: str) -> InProcessWorker:
    return w.acting_as(Principal(f"{tenant}:ann", tenant, frozenset({"operator"})))


def _ids(w: InProcessWorker, **filters: object) -> list[str]:
    return [r.id for r in w.search_runs(**filters).runs]  # type: ignore[arg-type]


def test_a_term_finds_by_id_prefix_agent_label_and_error_text(w: InProcessWorker) -> None:
    tag = uuid.uuid4().hex[:8]
    mine = _as(w, f"s-{tag}")
    plain = mine.start_run("finder", "go", run_id=f"find-{tag}-plain",
                           labels={"customer": f"acme_{tag}%"}).id
    failed = mine.start_run("refuser", "go", run_id=f"find-{tag}-fails").id
    other = _as(w, f"o-{tag}").start_run("refuser", "go", run_id=f"find-{tag}-theirs",
                                         labels={"customer": f"acme_{tag}%"}).id
    w.run_until_idle()
    assert mine.get_run(failed).status == "failed"

    assert _ids(mine, text=f"find-{tag}") == [failed, plain]  # id prefix, newest first
    assert _ids(mine, text=f"find-{tag}", oldest=True) == [plain, failed]
    assert _ids(mine, text="refuser") == [failed]  # agent
    assert _ids(mine, text=f"acme_{tag}%") == [plain]  # a label's value
    assert _ids(mine, text="100%_USED") == [failed]  # error text, any case
    assert _ids(mine, text=r"C:\tmp\x") == [failed]  # backslashes are characters
    assert other not in _ids(mine, text=f"find-{tag}")  # never another tenant's
    assert _ids(mine, text=f"acme_{tag}%", tenant=f"o-{tag}") == []
    # What would be patterns in LIKE match only themselves.
    expected = {"%": [failed], "_": [failed], "\\": [failed], "%%": [], "find%": [],
                f"find-{tag}%": [], f"find_{tag}": [], "100__used": [], "q%a": []}
    assert {p: _ids(mine, text=p) for p in expected} == expected
    # Unstorable text matches nothing (and reaches no database); blank is no filter.
    assert _ids(mine, text=f"find-{tag}\x00") == []
    assert _ids(mine, text=f"find-{tag}\ud800") == []
    assert _ids(mine, text="   ") == [failed, plain]
    with pytest.raises(InvalidInputError, match="limit is 200"):
        mine.search_runs(text="x" * 201)
    with pytest.raises(InvalidInputError, match="must be a string"):
        mine.search_runs(text=42)  # type: ignore[arg-type]


def test_a_page_reads_a_bounded_window_and_its_cursor_goes_on(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:8]
    mine = _as(w, f"s-{tag}")
    # Oldest first: a match, then four that do not match.
    target = mine.start_run("finder", "go", run_id=f"needle-{tag}").id
    for n in range(4):
        mine.start_run("finder", "go", run_id=f"hay-{tag}-{n}")
    monkeypatch.setattr(listing, "SEARCH_WINDOW", 2)
    first = mine.search_runs(text=f"needle-{tag}", limit=10)
    assert first.runs == [] and first.next_cursor is not None  # two hay runs read
    seen: list[str] = []
    cursor: str | None = first.next_cursor
    pages = 1
    while cursor is not None:
        page = mine.search_runs(text=f"needle-{tag}", limit=10, cursor=cursor)
        seen += [r.id for r in page.runs]
        cursor = page.next_cursor
        pages += 1
    assert seen == [target] and pages == 3  # 5 runs, 2 a page
    # Oldest first the needle is in the first window.
    assert _ids(mine, text=f"needle-{tag}", oldest=True, limit=10) == [target]
    # Without a term the window plays no part: a full page of 5.
    assert len(mine.search_runs(limit=10).runs) == 5


def test_oldest_first_pages_walk_every_run_once(w: InProcessWorker) -> None:
    tag = uuid.uuid4().hex[:8]
    mine = _as(w, f"s-{tag}")
    made = [mine.start_run("finder", "go", run_id=f"order-{tag}-{n}",
                           labels={"batch": tag}).id for n in range(5)]
    for labels in (None, {"batch": tag}):
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = mine.search_runs(labels=labels, oldest=True, limit=2, cursor=cursor)
            seen += [r.id for r in page.runs]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == made, labels
