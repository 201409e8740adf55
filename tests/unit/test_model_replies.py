"""What the model clients make of a reply's body (``openai_client.from_openai_json``,
``anthropic_client.from_anthropic_json``): they read replies into their own
models (``sdk_common.parse_reply``), not the SDKs' unvalidated ones, so every
shape a server or a hostile proxy can send is checked here. A body of the
wrong shape is ``MalformedModelOutputError`` (never an ``AttributeError``,
``TypeError`` or ``RecursionError`` from deep inside, as the SDKs' typed
replies gave, nor a silently empty answer), saying where it went wrong but not
the offending text; what servers add is ignored."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agent_worker.core.errors import (
    ContextLengthError,
    MalformedModelOutputError,
    ModelRefusalError,
)
from agent_worker.core.messages import ModelResponse, ToolCall, Usage
from agent_worker.model.anthropic_client import from_anthropic_json
from agent_worker.model.openai_client import from_openai_json

SECRET = "do-not-echo-" + "x" * 64


def completion(message: dict[str, Any], **top: Any) -> bytes:
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    body.update(top)
    return json.dumps(body).encode()


def call(arguments: Any, *, kind: str = "function") -> dict[str, Any]:
    return {"id": "call_1", "type": kind,
            "function": {"name": "lookup_order", "arguments": arguments}}


def test_text_usage_and_model_are_read() -> None:
    reply = from_openai_json(completion({"content": "Shipped."}))
    assert reply.message.role == "assistant" and reply.message.content == "Shipped."
    assert reply.usage == Usage(input_tokens=3, output_tokens=2)
    assert (reply.model, reply.stop_reason) == ("m", "stop")


def test_tool_calls_with_arguments_as_text_or_as_an_object() -> None:
    reply = from_openai_json(completion({"content": None, "tool_calls": [
        call('{"order": 7}'), {**call({"order": 8}), "id": "call_2"}]}))
    assert reply.message.content == ""
    assert reply.message.tool_calls == (
        ToolCall(id="call_1", name="lookup_order", arguments={"order": 7}),
        ToolCall(id="call_2", name="lookup_order", arguments={"order": 8}))


def test_what_servers_add_is_ignored_and_what_they_omit_is_absent() -> None:
    body = json.loads(completion({"content": "ok", "reasoning_content": "hmm"},
                                 system_fingerprint="fp", service_tier="default"))
    del body["usage"], body["model"], body["choices"][0]["finish_reason"]
    reply = from_openai_json(json.dumps(body).encode())
    assert reply.message.content == "ok"
    assert reply.usage == Usage() and reply.model == "" and reply.stop_reason is None
    nulls = from_openai_json(completion({"content": "ok"}, usage={
        "prompt_tokens": None, "completion_tokens": None}))
    assert nulls.usage == Usage()


def test_text_is_kept_as_sent_for_the_engine_to_clean() -> None:
    """U+0000 and a lone surrogate arrive escaped in JSON; the client passes
    them on (the lap applies ``agent_worker.core.untrusted``'s one rule)."""
    reply = from_openai_json(completion({"content": "a\u0000b\ud800c ☃"}))
    assert reply.message.content == "a\x00b\ud800c ☃"


def test_a_30_mb_answer_is_read_whole_for_the_lap_to_bound() -> None:
    """The clients read what arrives; the size limit is the lap's
    (``MAX_MODEL_OUTPUT_BYTES`` in ``engine.admit``), applied the same way to
    every client's answer."""
    text = "a\u0000b\ud800" * 7_500_000  # 30 M characters
    assert from_openai_json(completion({"content": text})).message.content == text
    assert from_anthropic_json(reply({"type": "text", "text": text})).message.content == text


def test_a_refusal_and_a_content_filter_are_refusals() -> None:
    with pytest.raises(ModelRefusalError, match="cannot help"):
        from_openai_json(completion({"content": None, "refusal": "I cannot help."}))
    body = json.loads(completion({"content": ""}))
    body["choices"][0]["finish_reason"] = "content_filter"
    with pytest.raises(ModelRefusalError, match="content_filter"):
        from_openai_json(json.dumps(body).encode())


MALFORMED_OPENAI: dict[str, tuple[bytes, str]] = {
    "not JSON": (b"<html>502 Bad Gateway</html>", "JSONDecodeError"),
    "not UTF-8": (b'{"choices": "\xff\xfe"}', "UnicodeDecodeError"),
    "empty": (b"", "JSONDecodeError"),
    "a JSON array": (b"[1, 2]", "body"),
    "no choices key": (json.dumps({"model": "m"}).encode(), "no choices"),
    "no choices": (completion({"content": "x"}, choices=[]), "no choices"),
    "choices not a list": (completion({"content": "x"}, choices={"0": SECRET}), "choices"),
    "a choice without a message": (completion({}, choices=[{"index": 0}]), "choices.0.message"),
    "content as a list of parts": (completion({"content": [{"text": SECRET}]}),
                                   "choices.0.message.content"),
    "usage not a number": (completion({"content": "x"}, usage={"prompt_tokens": SECRET}),
                           "usage.prompt_tokens"),
    "a custom tool call": (completion({"tool_calls": [call("{}", kind="custom")]}),
                           "unexpected custom tool call"),
    "a call without its function": (completion({"tool_calls": [{"id": "c", "type": "function"}]}),
                                    "unexpected function tool call"),
    "arguments not JSON": (completion({"tool_calls": [call("{order: 7")]}), "not JSON"),
    "arguments not an object": (completion({"tool_calls": [call("[7]")]}), "not a JSON object"),
    "arguments nested past the parser": (
        completion({"tool_calls": [call("[" * 100_000)]}), "nest too deep"),
    "a body nested past the parser": (b'{"choices": ' + b"[" * 100_000, "RecursionError"),
}


@pytest.mark.parametrize("case", list(MALFORMED_OPENAI))
def test_a_body_that_is_not_a_chat_completion_is_malformed_output(case: str) -> None:
    body, where = MALFORMED_OPENAI[case]
    assert_malformed(from_openai_json, body, where)


# --- Anthropic -------------------------------------------------------------------------


def reply(*blocks: Any, **top: Any) -> bytes:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": list(blocks), "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 4,
                      "cache_creation_input_tokens": 2, "cache_read_input_tokens": 30}}
    body.update(top)
    return json.dumps(body).encode()


def use(arguments: Any, **block: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": arguments,
            **block}


def test_anthropic_text_blocks_tool_uses_and_cached_tokens() -> None:
    got = from_anthropic_json(reply(
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "Let me "}, {"type": "text", "text": "look."},
        use({"order": 7}), {"type": "server_tool_use", "id": "s", "name": "web", "input": {}}))
    assert got.message.content == "Let me look."
    assert got.message.tool_calls == (
        ToolCall(id="toolu_1", name="lookup_order", arguments={"order": 7}),)
    assert got.usage == Usage(input_tokens=42, output_tokens=4)
    assert (got.model, got.stop_reason) == ("claude-x", "end_turn")


def test_anthropic_extra_keys_are_ignored_and_text_is_kept_as_sent() -> None:
    got = from_anthropic_json(reply({"type": "text", "text": "a\u0000b\ud800", "citations": []},
                                    container=None, service_tier="standard"))
    assert got.message.content == "a\x00b\ud800"


def test_anthropic_refusal_and_a_full_context_window() -> None:
    with pytest.raises(ModelRefusalError):
        from_anthropic_json(reply(stop_reason="refusal"))
    with pytest.raises(ContextLengthError):
        from_anthropic_json(reply(stop_reason="model_context_window_exceeded", id=SECRET * 100))


MALFORMED_ANTHROPIC: dict[str, tuple[bytes, str]] = {
    "not JSON": (b"<html>502 Bad Gateway</html>", "JSONDecodeError"),
    "a JSON array": (b"[]", "body"),
    "no content": (json.dumps({"usage": {"input_tokens": 1, "output_tokens": 1}}).encode(),
                   "content"),
    "content as a string": (reply(content=SECRET), "content"),
    "a block that is not an object": (reply(SECRET), "content.0"),
    "a block without its type": (reply({"text": SECRET}), "content.0.type"),
    "a text block without text": (reply({"type": "text", "text": None}), "text block 0"),
    "a tool use without its name": (reply(use({}, name=None)), "tool_use block 0"),
    "a tool use with a list for input": (reply(use([SECRET])), "not a JSON object"),
    "no usage": (reply(usage=None), "usage"),
    "usage not a number": (reply(usage={"input_tokens": SECRET, "output_tokens": 1}),
                           "usage.input_tokens"),
    "a body nested past the parser": (b'{"content": ' + b"[" * 100_000, "RecursionError"),
}


@pytest.mark.parametrize("case", list(MALFORMED_ANTHROPIC))
def test_a_body_that_is_not_a_messages_reply_is_malformed_output(case: str) -> None:
    body, where = MALFORMED_ANTHROPIC[case]
    assert_malformed(from_anthropic_json, body, where)


def assert_malformed(read: Callable[[bytes], ModelResponse], body: bytes, where: str) -> None:
    with pytest.raises(MalformedModelOutputError) as caught:
        read(body)
    assert where in str(caught.value)
    assert SECRET not in str(caught.value)
    # Nothing chained: no parser or pydantic error (which quote the input) rides along.
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__ or caught.value.__context__ is None
