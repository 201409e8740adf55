"""A retried ``start_run`` with a chosen run id: the same agent and input
return the run it started; another input (or agent) is refused with
``RunConflictError``, also for the loser of two concurrent starts. On both
dialects (Postgres hands JSON back as JSONB orders it); run ids are the
test's own (on Postgres the database is the session's)."""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from pydantic import BaseModel

import agent_worker.api as api
from agent_worker import InProcessWorker, ScriptedModel, register, turn
from agent_worker.agent import Agent
from agent_worker.cli import main
from agent_worker.core.errors import InvalidInputError, RunConflictError

register(Agent(name="start-once", model=ScriptedModel(lambda r: turn("ok"))))
register(Agent(name="start-other", model=ScriptedModel(lambda r: turn("ok"))))


class Order(BaseModel):
    order: int
    rush: bool = False


register(Agent(name="start-typed", model=ScriptedModel(lambda r: turn("ok")), input_model=Order))


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url)
    yield worker
    worker.close()


def _id() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


def test_the_same_start_again_returns_the_run(w: InProcessWorker) -> None:
    rid = _id()
    a = w.start_run("start-once", {"order": 7, "lines": [1, 2], "note": "x"}, run_id=rid)
    b = w.start_run("start-once", {"note": "x", "lines": [1, 2], "order": 7}, run_id=rid)
    assert a.id == b.id == rid and a.created_at == b.created_at
    assert [lap.run_id for lap in w.queue.pending].count(rid) == 1


@pytest.mark.parametrize("second", [{"order": 8}, {"order": 7, "extra": True}, None, "7"])
def test_another_input_for_the_same_id_is_refused(w: InProcessWorker, second: Any) -> None:
    rid = _id()
    w.start_run("start-once", {"order": 7}, run_id=rid)
    with pytest.raises(RunConflictError, match=f"run {rid} already exists with a different "
                                                "input") as got:
        w.start_run("start-once", second, run_id=rid)
    assert got.value.code == "run_conflict" and isinstance(got.value, InvalidInputError)
    assert w.get_run(rid).input == {"order": 7}
    assert [lap.run_id for lap in w.queue.pending].count(rid) == 1


def test_inputs_are_compared_as_the_agent_admits_them(w: InProcessWorker) -> None:
    """The stored input is the input model's dump (defaults filled in): the
    same input given again matches it, however it was spelled."""
    rid = _id()
    w.start_run("start-typed", {"order": 7}, run_id=rid)
    assert w.get_run(rid).input == {"order": 7, "rush": False}
    assert w.start_run("start-typed", {"order": 7}, run_id=rid).id == rid
    assert w.start_run("start-typed", {"order": 7, "rush": False}, run_id=rid).id == rid
    with pytest.raises(RunConflictError):
        w.start_run("start-typed", {"order": 7, "rush": True}, run_id=rid)


def test_another_agent_for_the_same_id_is_refused(w: InProcessWorker) -> None:
    rid = _id()
    w.start_run("start-once", {"order": 7}, run_id=rid)
    with pytest.raises(RunConflictError, match="already exists for agent start-once"):
        w.start_run("start-other", {"order": 7}, run_id=rid)
    assert w.get_run(rid).agent_name == "start-once"


def test_the_loser_of_a_race_compares_after_the_insert(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both starts looked before either inserted: the one whose insert found
    the other's run gets it only if it asked for the same one."""
    rid = _id()
    w.start_run("start-once", {"order": 7}, run_id=rid)
    monkeypatch.setattr(w, "_existing", lambda run_id, tenant: None)  # it looked too early
    assert w.start_run("start-once", {"order": 7}, run_id=rid).id == rid
    with pytest.raises(RunConflictError, match="different input"):
        w.start_run("start-once", {"order": 8}, run_id=rid)
    assert w.get_run(rid).input == {"order": 7}
    assert [lap.run_id for lap in w.queue.pending].count(rid) == 1


def test_concurrent_starts_with_different_inputs_one_wins(dialect_url: str) -> None:
    """Two workers (two connection pools) start one id at once: one run, and
    the start with the other input is refused, never handed that run."""
    rid = _id()
    workers = [InProcessWorker(dialect_url) for _ in range(2)]
    gate = threading.Barrier(2)
    got: dict[int, Any] = {}

    def start(n: int) -> None:
        gate.wait()
        try:
            got[n] = workers[n].start_run("start-once", {"order": n}, run_id=rid)
        except Exception as e:  # the test looks at what each got
            got[n] = e

    try:
        threads = [threading.Thread(target=start, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stored = workers[0].get_run(rid)
    finally:
        for worker in workers:
            worker.close()
    winner = stored.input["order"]
    assert got[winner].id == rid
    assert isinstance(got[1 - winner], RunConflictError), got


def test_submit_again_from_the_cli(w: InProcessWorker) -> None:
    rid = _id()
    api.configure(w)
    try:
        def submit(payload: str, code: int = 0) -> Any:
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                got = main(["submit", "start-once", "--input", payload, "--run-id", rid,
                            "--json"])
            assert got == code, (out.getvalue(), err.getvalue())
            return json.loads(err.getvalue() if code else out.getvalue())

        assert submit('{"order": 7}')["id"] == rid
        assert submit('{"order": 7}')["id"] == rid
        refused = submit('{"order": 8}', code=2)["error"]
        assert refused["code"] == "run_conflict" and "different input" in refused["message"]
        assert refused["meaning"] == "bad input"
    finally:
        api.configure(None)
    assert w.get_run(rid).input == {"order": 7}
