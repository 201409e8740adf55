"""Property: arbitrary Unicode through every door of a run, on SQLite
and on Postgres. Whatever the text (U+0000, lone surrogates, control and escape
characters, RTL marks, 4-byte characters), every run ends where its script says,
nothing escapes ``run_lap``, and what is stored is what ``agent_worker.core.untrusted``
says: the text with U+0000 and lone surrogates replaced by U+FFFD."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent_worker import Agent, InProcessWorker, ScriptedModel, register, tool, turn
from agent_worker.control import wait_for_signal_tool
from agent_worker.core.errors import InvalidInputError, ToolError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.core.untrusted import check_name
from agent_worker.model.scripted import model_turns
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext
from tests.principals import acting

FFFD = "\ufffd"
NASTY = ["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\x1b", "\x1b[2J", "\x1b]0;pwned\x07",
         "\r", "\n", "\x07", "\x7f", "\x9b", "\u202e", "\u200f", "\u2028", "\U0001f600",
         "\U00010348", FFFD, '"', "\\", "\\u0000", "{", "]"]
texts = st.lists(st.one_of(st.sampled_from(NASTY), st.characters(exclude_categories=())),
                 max_size=12).map("".join)
names = st.one_of(st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True), texts)

RAW: dict[str, dict[str, Any]] = {}


def rule(value: str) -> str:
    """The documented rule, spelled out independently of the code under test."""
    return "".join(FFFD if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in value)


def final_result(text: str) -> Any:
    """A final answer is stored parsed when it is JSON (then cleaned), else as text."""
    try:
        value = json.loads(rule(text))
    except ValueError:
        return rule(text)
    return json.loads(rule(json.dumps(value, ensure_ascii=False)))


@tool(kind="idempotent")
def prop_echo(text: str, ctx: ToolContext) -> str:
    """Answers with the example's raw tool result."""
    return str(RAW[ctx.run_id]["result"])


@tool(kind="idempotent")
def prop_fail(ctx: ToolContext) -> None:
    """Fails with the example's raw error text."""
    raise ToolError(str(RAW[ctx.run_id]["error"]))


@tool(kind="idempotent", approval=True)
def prop_approved(text: str) -> str:
    """Needs a human's approval first."""
    return "ok"


def _script(r: ModelRequest) -> ModelResponse:
    raw = RAW[r.run_id]
    step = model_turns(r)  # laps also resume pauses, so count the model's turns
    if step == 0:
        return turn(raw["model"], [("prop_echo", {"text": raw["arg"]}), ("prop_fail", {}),
                                   ("wait_for_signal", {"name": raw["signal"]})])
    if step == 1:
        return turn("", [("prop_approved", {"text": raw["arg"]})])
    return turn(raw["final"])


register(Agent(name="prop-hostile", model=ScriptedModel(_script), window_messages=200,
               tools=[prop_echo, prop_fail, prop_approved, wait_for_signal_tool], redact=None))


@pytest.fixture
def worker(dialect_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=2)
    yield w
    assert isinstance(w.rt.store, SqlStore)
    w.rt.store.dispose()


def _valid_name(name: str) -> bool:
    try:
        check_name(name, "signal name", max_chars=100)
    except InvalidInputError:
        return False
    return True


# No shrinking: each example runs whole runs (slow to shrink on a shared machine),
# and a failing example is readable as generated.
@settings(max_examples=40, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(model=texts, arg=texts, result=texts, error=texts, signal=names, payload=texts,
       comment=texts, reason=texts, final=texts)
def test_any_text_through_every_door_is_stored_by_the_rule(
        worker: InProcessWorker, model: str, arg: str, result: str, error: str, signal: str,
        payload: str, comment: str, reason: str, final: str) -> None:
    run = worker.start_run("prop-hostile", {"payload": payload})
    RAW[run.id] = {"model": model, "arg": arg, "result": result, "error": error,
                   "signal": signal, "final": final}
    worker.run_until_idle()
    if _valid_name(signal):
        assert worker.get_run(run.id).waiting_for == f"signal:{signal}"
        worker.send_signal(run.id, signal, {"text": payload})
        worker.run_until_idle()
    assert worker.get_run(run.id).status == "waiting"
    approval = acting(worker, "ops").approve(run.id, comment=comment)
    assert approval.comment == rule(comment)
    worker.run_until_idle()

    done = worker.get_run(run.id)
    assert done.status == "succeeded", (done.error_code, done.error_message)
    assert done.result == final_result(final)
    assert done.input == {"payload": rule(payload)}
    messages = [m.message for m in worker.messages(run.id)]
    assistant = [m for m in messages if m.role == "assistant"]
    assert [m.content for m in assistant] == [rule(model), "", rule(final)]
    assert assistant[0].tool_calls[0].arguments == {"text": rule(arg)}
    tools = [m for m in messages if m.role == "tool"]
    assert (tools[0].content, tools[0].is_error) == (rule(result), False)
    assert (tools[1].content, tools[1].is_error) == (rule(error), True)
    if _valid_name(signal):
        delivered = json.loads(tools[2].content)
        assert (delivered["signal"], delivered["payload"]) == (signal, {"text": rule(payload)})
    else:
        assert tools[2].is_error and tools[2].content.startswith("signal name must be")
    why = f": {rule(comment)}" if comment else ""
    assert tools[3].content.endswith(f"{why}. Result: ok")
    effects = {e.tool_name: e for e in worker.effects(run.id)}
    assert effects["prop_echo"].result == rule(result)
    assert effects["prop_echo"].args == {"text": rule(arg)}
    assert effects["prop_fail"].error == rule(error)

    cancelled = worker.start_run("prop-hostile", None)
    acting(worker, "ops").cancel(cancelled.id, reason=reason)
    worker.run_until_idle()
    ended = worker.get_run(cancelled.id)
    assert (ended.status, ended.cancel_reason) == ("cancelled", rule(reason))
