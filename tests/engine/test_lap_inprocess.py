"""The lap engine in-process (SQLite): bad input, bad model output, retries,
dead-letter and operator retry, version routing. Fast, no broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_worker import Agent, InProcessWorker, ScriptedModel, register, tool, turn
from agent_worker.agent import Registry
from agent_worker.api import AgentWorker
from agent_worker.core.errors import (
    InvalidInputError,
    MalformedModelOutputError,
    PayloadTooLargeError,
    UnknownAgentError,
)
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.core.settings import Settings
from agent_worker.inprocess import LocalQueue
from agent_worker.runtime import Runtime
from agent_worker.store.base import DueLap
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from tests.principals import acting


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _first_tool_result(w: AgentWorker, run_id: str) -> str:
    return next(m.message.content for m in w.messages(run_id) if m.message.role == "tool")


@pytest.fixture
def worker(dialect_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0,
                        max_lap_attempts=3)
    yield w
    w.rt.store.dispose()


def _agent(name: str, script: Any, **kw: Any) -> Agent:
    return register(Agent(name=name, model=ScriptedModel(script), tools=[add], **kw))


def test_unknown_tool_and_invalid_arguments_go_back_to_the_model(
        worker: InProcessWorker) -> None:
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap == 1:
            return turn("", [("nope", {}), ("add", {"a": "x", "b": 2}), ("add", {"a": 1, "b": 2})])
        return turn("done")

    _agent("t-bad-calls", script)
    run = worker.start_run("t-bad-calls", "go")
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.lap == 2
    results = [m.message for m in worker.messages(run.id) if m.message.role == "tool"]
    assert results[0].is_error and "Unknown tool 'nope'" in results[0].content
    assert results[1].is_error and "Invalid arguments for add: a:" in results[1].content
    assert not results[2].is_error and results[2].content == "3"


def test_malformed_model_output_is_retried_then_fails(worker: InProcessWorker) -> None:
    model = ScriptedModel(lambda r: (_ for _ in ()).throw(MalformedModelOutputError("bad json")))
    register(Agent(name="t-malformed", model=model))
    run = worker.start_run("t-malformed", "go")
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "failed" and done.error_code == "malformed_model_output"
    assert model.calls == 3  # max_lap_attempts: sampling again may give a usable answer
    assert [e.kind for e in worker.events(run.id)].count("retry") == 2


def test_oversized_model_output_is_retried_not_failed_at_once(worker: InProcessWorker) -> None:
    answers = iter(["x" * 300_000, "fine"])
    model = ScriptedModel(lambda r: turn(next(answers)))
    register(Agent(name="t-huge", model=model))
    run = worker.start_run("t-huge", "go")
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.result == "fine" and model.calls == 2
    assert [e.kind for e in worker.events(run.id)].count("retry") == 1


def test_oversized_model_output_fails_after_the_attempt_limit(worker: InProcessWorker) -> None:
    _agent("t-huge-always", lambda r: turn("x" * 300_000))
    run = worker.start_run("t-huge-always", "go")
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "failed" and done.error_code == "model_output_too_large"
    assert [c[0] for c in worker.checkpoints(run.id)] == [0]


def test_poison_lap_dead_letters_then_operator_retry_resumes(worker: InProcessWorker) -> None:
    state = {"fail": True}

    def script(r: ModelRequest) -> ModelResponse:
        if state["fail"]:
            raise RuntimeError("provider exploded")
        return turn("recovered") if r.lap > 1 else turn("", [("add", {"a": 1, "b": 1})])

    model = ScriptedModel(script)
    register(Agent(name="t-poison", model=model, tools=[add]))
    run = worker.start_run("t-poison", "go")
    worker.run_until_idle()
    failed = worker.get_run(run.id)
    assert failed.status == "failed" and failed.error_code == "lap_error"
    assert "provider exploded" in (failed.error_message or "")
    assert "Traceback" in (failed.error_detail or "")
    assert model.calls == 3  # max_lap_attempts
    assert [e.kind for e in worker.events(run.id)].count("retry") == 2
    state["fail"] = False
    acting(worker, "oncall").retry(run.id)
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.result == "recovered" and done.lap == 2


#: For tests that assert the whole database holds nothing else: on Postgres the
#: session's database is shared with every other test.
sqlite_only = pytest.mark.parametrize("dialect_url", ["sqlite"], indirect=True)


@sqlite_only
@pytest.mark.parametrize(("kwargs", "error"), [
    ({"agent": "no-such-agent"}, UnknownAgentError),
    ({"run_id": "bad id with spaces"}, InvalidInputError),
    ({"run_id": "x" * 300}, InvalidInputError),
    ({"input": {"n": float("nan")}}, InvalidInputError),
    ({"input": {"blob": object()}}, InvalidInputError),
    ({"input": "x" * 300_000}, PayloadTooLargeError),
    ({"tenant": ""}, InvalidInputError),
])
def test_invalid_start_writes_nothing(worker: InProcessWorker, kwargs: dict[str, Any],
                                      error: type[Exception]) -> None:
    _agent("t-valid", lambda r: turn("ok"))
    args = {"agent": "t-valid", "input": {"n": 1}, **kwargs}
    agent = args.pop("agent")
    with pytest.raises(error):
        worker.start_run(agent, args.pop("input"), **args)
    assert worker.list_runs() == []


@sqlite_only
def test_input_model_validates_input(worker: InProcessWorker) -> None:
    from agent_worker.demo.refund_desk import DemoInput  # noqa: F401 - registers the agent

    with pytest.raises(InvalidInputError, match="invalid input for refund-desk"):
        worker.start_run("refund-desk", {"orders": 999})
    assert worker.list_runs() == []


@sqlite_only
def test_start_run_twice_with_same_id_is_one_run(worker: InProcessWorker) -> None:
    _agent("t-once", lambda r: turn("ok"))
    a = worker.start_run("t-once", "go", run_id="order-77")
    b = worker.start_run("t-once", "go", run_id="order-77")
    assert a.id == b.id and len(worker.list_runs()) == 1
    assert len(worker.queue.pending) == 1


def test_newer_checkpoint_schema_is_refused_and_marked_for_attention(
        worker: InProcessWorker) -> None:
    from sqlalchemy import update

    from agent_worker.store.rows import checkpoints

    _agent("t-schema", lambda r: turn("ok"))
    run = worker.start_run("t-schema", "go")
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:
        c.execute(update(checkpoints).where(checkpoints.c.run_id == run.id)
                  .values(state={"schema_version": 99, "lap": 0}))
    worker.run_until_idle()
    held = worker.get_run(run.id)
    assert held.status == "waiting" and held.waiting_for == "attention"
    assert held.error_code == "checkpoint_version" and "newer" in (held.error_message or "")


def _isolated(tmp_path: Path, name: str, agents: list[Agent]) -> AgentWorker:
    url = f"sqlite:///{tmp_path / name}"
    upgrade(url)
    reg = Registry()
    for a in agents:
        reg.register(a)
    return AgentWorker(Runtime(store=SqlStore(url), dispatcher=LocalQueue(), registry=reg,
                               settings=Settings(database_url=url, retry_backoff_seconds=0)))


def _drain(w: AgentWorker) -> None:
    from agent_worker.engine.lap import run_lap

    q = w.rt.dispatcher
    assert isinstance(q, LocalQueue)
    while q.pending:
        lap = q.pending.popleft()
        run_lap(w.rt, lap.run_id, lap.lap)


def _two_lap(r: ModelRequest) -> ModelResponse:
    return turn("", [("add", {"a": r.lap, "b": 0})]) if r.lap < 3 else turn("v-done")


def test_run_of_an_old_version_continues_on_a_declared_migration(tmp_path: Path) -> None:
    v1 = Agent(name="versioned", version="1", model=ScriptedModel(_two_lap), tools=[add])
    w1 = _isolated(tmp_path, "v.db", [v1])
    run = w1.start_run("versioned", "go")
    _drain_one(w1)
    # Redeploy: only version 2 serves, and it declares it resumes version 1.
    migrated: list[str] = []

    def migrate(ckpt: Any, from_version: str) -> Any:
        migrated.append(from_version)
        return ckpt.model_copy(update={"facts": {**ckpt.facts, "migrated_from": from_version}})

    v2 = Agent(name="versioned", version="2", model=ScriptedModel(_two_lap), tools=[add],
               resumes=("1",), migrate=migrate)
    w2 = _isolated(tmp_path, "v.db", [v2])
    w2.rt.dispatcher = w1.rt.dispatcher
    _drain(w2)
    done = w2.get_run(run.id)
    assert done.status == "succeeded" and migrated == ["1"]
    assert w2.state_at(run.id, done.lap).agent_version == "2"


def test_run_of_an_unserved_version_waits_instead_of_crash_looping(tmp_path: Path) -> None:
    v1 = Agent(name="versioned2", version="1", model=ScriptedModel(_two_lap), tools=[add])
    w1 = _isolated(tmp_path, "u.db", [v1])
    run = w1.start_run("versioned2", "go")
    _drain_one(w1)
    v2 = Agent(name="versioned2", version="2", model=ScriptedModel(_two_lap), tools=[add])
    w2 = _isolated(tmp_path, "u.db", [v2])
    w2.rt.dispatcher = w1.rt.dispatcher
    _drain(w2)
    waiting = w2.get_run(run.id)
    assert waiting.status == "queued" and waiting.lap == 1 and waiting.lap_attempts == 0
    assert [e.kind for e in w2.events(run.id)].count("unserved") == 1
    # A version-1 worker comes back: the run finishes on the code it started with.
    w1.rt.dispatcher.send(DueLap(run.id, 2, "versioned2", "1"))
    _drain(w1)
    assert w1.get_run(run.id).status == "succeeded"


def _drain_one(w: AgentWorker) -> None:
    from agent_worker.engine.lap import run_lap

    q = w.rt.dispatcher
    assert isinstance(q, LocalQueue)
    lap = q.pending.popleft()
    run_lap(w.rt, lap.run_id, lap.lap)


def test_checkpoint_of_the_previous_schema_version_is_migrated_and_resumed(
        worker: InProcessWorker) -> None:
    from sqlalchemy import update

    from agent_worker.store.rows import checkpoints

    seen: list[str] = []

    def script(r: ModelRequest) -> ModelResponse:
        seen.append(r.instructions)
        return turn("resumed")

    _agent("t-schema-v1", script)
    run = worker.start_run("t-schema-v1", "go")
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    v2 = store.get_checkpoint(run.id, 0)
    assert v2 is not None
    v1 = {k: v for k, v in v2.items() if k not in ("facts", "pending_calls", "summary_seq")}
    v1.update(schema_version=1, scratch={"customer": "c-42"})
    with store.engine.begin() as c:
        c.execute(update(checkpoints).where(checkpoints.c.run_id == run.id)
                  .values(state=v1, schema_version=1))
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.result == "resumed"
    assert '"customer": "c-42"' in seen[0]  # v1's scratch became v2's pinned facts
    assert worker.state_at(run.id, 1).schema_version == 2


def test_a_lap_stores_no_flag_that_is_off_and_no_key_it_can_derive(
        worker: InProcessWorker) -> None:
    """Each lap writes its model message and its ``lap_committed`` event, so
    every byte of them is WAL on every lap: the model message has
    no idempotency key (it is the row's run and lap) and a stop reason only
    when the model gave one; the trace has no false or null flags and no
    counts the lap's messages already carry. What a model said is kept."""
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap == 1:
            return turn("", [("add", {"a": 1, "b": 2})])
        return turn("done").model_copy(update={"stop_reason": "end_turn"})

    _agent("t-lean-lap", script)
    run = worker.start_run("t-lean-lap", {})
    worker.run_until_idle()
    first, last = [m.message for m in worker.messages(run.id) if m.message.role == "assistant"]
    assert first.meta == {"usage": {"input_tokens": 100, "output_tokens": 20},
                          "model": "scripted"}
    assert last.meta is not None and last.meta["stop_reason"] == "end_turn"
    commits = [e.data for e in worker.events(run.id)
               if e.kind == "lap_committed" and e.data is not None]
    assert [[m["step"] for m in d["trace"]] for d in commits] == [
        ["model", "tool", "commit"], ["model", "commit"]]
    for data in commits:
        assert set(data) == {"trace", "attempt"} and data["attempt"] == 1
        for mark in data["trace"]:
            assert False not in mark.values() and None not in mark.values(), mark
    tool_mark = commits[0]["trace"][1]
    assert tool_mark["name"] == "add" and "error" not in tool_mark
