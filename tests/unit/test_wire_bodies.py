"""Both model clients post their bodies through the SDK's generic ``post``,
past the typed ``create`` methods. For OpenAI that skips the TypedDict
transform (``openai_client.wire_body``), a recursive walk that cost about
15 ms of worker CPU per 40-message lap (and, since, 60 us per call for the
params that were still walked).

Checked: the body on the wire equals what each SDK's own typed path sends for
a request with every kind of message (so a future SDK whose typed path starts
renaming, reformatting or adding something we send fails here), and the
OpenAI transform never runs (so the saving cannot quietly regress).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from openai.resources.chat.completions import completions as sdk_completions

from agent_worker.core.messages import Message, ModelRequest, ToolCall, ToolSpec
from agent_worker.model.anthropic_client import (
    AnthropicModel,
    to_anthropic_messages,
    to_anthropic_tools,
)
from agent_worker.model.openai_client import (
    OpenAIChatModel,
    to_openai_messages,
    to_openai_tools,
)
from tests.fakes.fake_server import FakeLLMServer

KEY_ENV = "AW_TEST_WIRE_KEY"
LOOKUP = ToolSpec(name="lookup_order", description="Find an order by id.",
                  parameters={"type": "object", "properties": {"order": {"type": "integer"}},
                              "required": ["order"]})


def every_kind_of_message() -> ModelRequest:
    """System, user, assistant text, assistant with two calls, a tool result and
    a tool error, non-ASCII text: what a real window holds."""
    calls = (ToolCall(id="c1", name="lookup_order", arguments={"order": 7}),
             ToolCall(id="c2", name="lookup_order", arguments={"order": 8, "note": "ü"}))
    return ModelRequest(
        run_id="run-w", lap=3, instructions="You are a refund desk.",
        messages=(Message(role="system", content="Operator note: be brief."),
                  Message(role="user", content="Where are orders 7 and 8? ☃"),
                  Message(role="assistant", content="Looking.", tool_calls=calls),
                  Message(role="tool", content='{"status": "shipped"}', tool_call_id="c1"),
                  Message(role="tool", content="no such order", tool_call_id="c2",
                          is_error=True),
                  Message(role="assistant", content="One shipped.")),
        tools=(LOOKUP,), max_output_tokens=77, idempotency_key="run-w:3:model")


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    monkeypatch.setenv(KEY_ENV, "sk-wire-test")
    with FakeLLMServer([{"text": "ok"}] * 4) as running:  # picked by lap: 2
        yield running


def test_wire_body_equals_the_sdks_typed_path(server: FakeLLMServer) -> None:
    request = every_kind_of_message()
    with OpenAIChatModel("gpt-4o-mini", base_url=server.url + "/v1", api_key_env=KEY_ENV,
                         max_retries=0) as model:
        model.complete(request)
    # The SDK's own path, as the client called it before: messages= and tools=.
    with openai.OpenAI(api_key="sk-wire-test", base_url=server.url + "/v1",
                       max_retries=0) as sdk:
        sdk.chat.completions.create(model="gpt-4o-mini", messages=to_openai_messages(request),
                                    tools=to_openai_tools(request), max_completion_tokens=77)
    ours, sdks = (entry["body"] for entry in server.requests)
    assert ours == sdks
    assert len(ours["messages"]) == 7  # instructions + the six messages


def test_anthropic_body_equals_the_sdks_typed_path(server: FakeLLMServer) -> None:
    request = every_kind_of_message()
    with AnthropicModel("claude-x", base_url=server.url, api_key_env=KEY_ENV,
                        max_retries=0) as model:
        model.complete(request)
    with anthropic.Anthropic(api_key="sk-wire-test", base_url=server.url,
                             max_retries=0) as sdk:
        sdk.messages.create(model="claude-x", max_tokens=77, system=request.instructions,
                            messages=to_anthropic_messages(request),
                            tools=to_anthropic_tools(request))
    ours, sdks = (entry["body"] for entry in server.requests)
    assert ours == sdks
    assert ours["system"] == "You are a refund desk." and len(ours["tools"]) == 1


def test_the_call_skips_the_sdk_transform(server: FakeLLMServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = getattr(sdk_completions, "maybe_transform")  # noqa: B009 (not re-exported)

    def spy(data: Any, expected_type: Any) -> Any:
        seen.append(data)
        return real(data, expected_type)

    monkeypatch.setattr(sdk_completions, "maybe_transform", spy)
    with OpenAIChatModel("gpt-4o-mini", base_url=server.url + "/v1", api_key_env=KEY_ENV,
                         max_retries=0) as model:
        model.complete(every_kind_of_message())
    assert seen == []
    assert len(server.requests[0]["body"]["messages"]) == 7
