"""``ToolCall.arguments_json``: the arguments' JSON text, built once per call
object (a window's calls are sized and sent every lap), the very text
``json.dumps`` gives, and never carried over to a copy with other arguments."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from agent_worker.core.messages import Message, ModelRequest, ToolCall
from agent_worker.model.openai_client import to_openai_messages


def test_the_text_is_json_dumps_of_the_arguments() -> None:
    arguments: dict[str, Any] = {"path": "notes/é.md", "n": [1, 2.5, None], "deep": {"k": True}}
    assert ToolCall(id="c", name="read", arguments=arguments).arguments_json \
        == json.dumps(arguments)


def test_the_text_is_built_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    call = ToolCall(id="c", name="read", arguments={"path": "a"})
    dumps = json.dumps
    built: list[object] = []

    def counting(value: object, **kw: Any) -> str:
        built.append(value)
        return dumps(value, **kw)

    monkeypatch.setattr(json, "dumps", counting)
    request = ModelRequest(run_id="r", lap=3, idempotency_key="r:3:model", instructions="",
                           messages=(Message(role="assistant", tool_calls=(call,)),), tools=())
    for _ in range(3):
        wire = to_openai_messages(request)
    sent = cast(dict[str, Any], wire[0])["tool_calls"][0]["function"]["arguments"]
    assert sent == '{"path": "a"}'
    assert built == [{"path": "a"}]


def test_a_copy_with_other_arguments_builds_its_own_text() -> None:
    call = ToolCall(id="c", name="read", arguments={"path": "a"})
    assert call.arguments_json == '{"path": "a"}'
    moved = call.model_copy(update={"arguments": {"path": "b"}})
    assert moved.arguments_json == '{"path": "b"}'
    assert call.arguments_json == '{"path": "a"}'
    assert call == ToolCall(id="c", name="read", arguments={"path": "a"})  # not compared
