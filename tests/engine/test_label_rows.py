"""Labels as rows (migration ``0016_run_labels``): written with the run,
stored exactly or refused, and what a search walks, on SQLite and Postgres.

The module's database is shared: every test labels its runs with a value of
its own (``_tag()``) and looks only for those.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import insert, select

from agent_worker import InProcessWorker, ScriptedModel, turn
from agent_worker.agent import Agent
from agent_worker.core.errors import InvalidInputError
from agent_worker.store.labelrows import run_labels
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore


def tagged(worker: InProcessWorker) -> InProcessWorker:
    """``worker`` with ``tagged``, an agent that finishes in one lap."""
    worker.rt.registry.register(Agent(name="tagged", model=ScriptedModel(
        lambda r: turn("done"))))
    return worker


@pytest.fixture
def w(bare_worker: InProcessWorker) -> InProcessWorker:
    return tagged(bare_worker)


def _tag() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _rows(w: InProcessWorker, run_id: str) -> dict[str, tuple[str, str | None]]:
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:  # the system scope: every tenant's rows
        return {r.key: (r.value, r.tenant) for r in c.execute(
            select(run_labels).where(run_labels.c.run_id == run_id))}


def test_a_runs_labels_are_rows_written_with_it(w: InProcessWorker) -> None:
    tag = _tag()
    labels = {"batch": tag, "customer": "café ☕ 日本", "emoji": "🚀" * 100}
    run = w.start_run("tagged", "go", tenant="t-rows", labels=labels)
    assert _rows(w, run.id) == {k: (v, "t-rows") for k, v in labels.items()}
    assert _rows(w, w.start_run("tagged", "go", tenant="t-rows").id) == {}
    assert w.get_run(run.id).labels == labels
    for key, value in labels.items():  # found by each, exactly as given
        assert [r.id for r in w.search_runs(labels={key: value, "batch": tag}).runs] \
            == [run.id]
    assert [r.id for r in w.search_runs(labels={"emoji": "🚀" * 100}).runs][:1] == [run.id]
    assert w.search_runs(labels={"batch": tag, "emoji": "🚀" * 99}).runs == []
    w.run_until_idle()  # a lap changes neither the labels nor their rows
    assert _rows(w, run.id) == {k: (v, "t-rows") for k, v in labels.items()}


def test_refused_labels_leave_no_run_and_no_row(w: InProcessWorker) -> None:
    tag = _tag()
    bads: tuple[dict[str, Any], ...] = (
        {"k": "nul\x00byte"}, {"k": "lone \ud800 surrogate"}, {"k": "x" * 101},
        {"k": "🚀" * 101}, {"k\x00": "v"}, {"bad key": "v"}, {"k": ""}, {"k": 5},
        {f"k{i}": "v" for i in range(16)} | {"batch": tag})
    for bad in bads:
        with pytest.raises(InvalidInputError):
            w.start_run("tagged", "go", tenant="t-rows", labels={"batch": tag, **bad})
    assert w.search_runs(labels={"batch": tag}).runs == []
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        assert c.execute(select(run_labels).where(run_labels.c.value == tag)).all() == []
    most = {f"k{i}": f"v{i}" for i in range(15)} | {"batch": tag}  # 16: the limit
    run = w.start_run("tagged", "go", tenant="t-rows", labels=most)
    assert len(_rows(w, run.id)) == 16


def test_one_label_pages_newest_first_through_the_cursor(w: InProcessWorker) -> None:
    tag = _tag()
    ids = [w.start_run("tagged", "go", tenant="t-pages",
                       labels={"batch": tag, "parity": str(i % 2)}).id for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = w.search_runs(labels={"batch": tag}, limit=3, cursor=cursor)
        seen += [r.id for r in page.runs]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids[::-1]
    # The other filters apply to the walk; several labels match all of them.
    assert [r.id for r in w.search_runs(labels={"batch": tag}, tenant="t-pages",
                                        created_after=w.get_run(ids[2]).created_at,
                                        created_before=w.get_run(ids[5]).created_at).runs
            ] == ids[4:1:-1]
    assert [r.id for r in w.search_runs(labels={"batch": tag}, tenant="t-other").runs] == []
    odd = w.search_runs(labels={"parity": "1", "batch": tag}, limit=2)
    rest = w.search_runs(labels={"parity": "1", "batch": tag}, cursor=odd.next_cursor)
    assert [r.id for r in odd.runs + rest.runs] == ids[5::-2]
    w.run_until_idle()
    assert [r.id for r in w.search_runs(labels={"batch": tag}, status="succeeded",
                                        limit=2).runs] == ids[:-3:-1]
    assert w.search_runs(labels={"batch": tag}, status="queued").runs == []


def test_a_run_inserted_by_code_that_knows_no_run_labels_is_found(
        w: InProcessWorker) -> None:
    """The rows come from a trigger on ``runs``, so a run inserted by any
    path (older code in a rolling deploy, a seed, a schedule's firing) is
    found by its labels, in the transaction that inserted it."""
    tag = _tag()
    store = w.rt.store
    assert isinstance(store, SqlStore)
    now = w.rt.clock.now()
    with store.engine.begin() as c:
        c.execute(insert(runs).values(
            id=f"raw-{tag}", tenant="t-raw", agent_name="tagged", agent_version="1",
            status="succeeded", next_lap=1, lap_attempts=0, input={}, limits={}, laps_used=0,
            input_tokens=0, output_tokens=0, cost_micros=0, retention="full", recoveries=0,
            created_at=now, updated_at=now, labels={"batch": tag, "name": "Zoë 🚀"}))
        assert c.execute(select(run_labels.c.key).where(
            run_labels.c.run_id == f"raw-{tag}")).scalars().all() != []
    assert _rows(w, f"raw-{tag}") == {"batch": (tag, "t-raw"), "name": ("Zoë 🚀", "t-raw")}
    assert [r.id for r in w.search_runs(labels={"name": "Zoë 🚀", "batch": tag}).runs] \
        == [f"raw-{tag}"]
