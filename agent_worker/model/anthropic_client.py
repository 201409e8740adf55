"""Anthropic's messages API with tool use, through the official SDK.

Why a mapping of its own: Anthropic carries tool calls as ``tool_use`` content blocks of
the assistant turn and tool results as ``tool_result`` blocks of the *next user turn*,
where all results answering one assistant turn must sit together at the start. The
engine's log keeps one message per tool result, so consecutive results are merged here.
"""

from __future__ import annotations

import ssl

import anthropic
from anthropic.types import ContentBlockParam, MessageParam, ToolParam

from agent_worker.core.errors import (
    ContextLengthError,
    InvalidInputError,
    MalformedModelOutputError,
    ModelRefusalError,
)
from agent_worker.core.messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
from agent_worker.model.failures import ProviderFailures
from agent_worker.model.sdk_common import (
    ResponseHook,
    SdkModel,
    WireModel,
    idempotency_headers,
    kept_alive,
    parse_reply,
    tool_arguments,
)

#: The API requires an output limit; this one suits a tool-calling lap.
DEFAULT_MAX_OUTPUT_TOKENS = 1024


class AnthropicModel(SdkModel[anthropic.Anthropic]):
    """A model behind ``POST {base_url}/v1/messages``.

    ``max_output_tokens`` is required by the API, hence a default. The key comes from
    ``$<api_key_env>`` or ``api_key_file``.
    """

    provider = "anthropic"
    failures = ProviderFailures(
        provider="anthropic",
        api_error=anthropic.APIError,
        status_error=anthropic.APIStatusError,
        connection_error=anthropic.APIConnectionError,
    )

    default_key_env = "ANTHROPIC_API_KEY"
    default_max_output_tokens = DEFAULT_MAX_OUTPUT_TOKENS

    def _new_sdk(self, api_key: str, response_hooks: list[ResponseHook],
                 tls: ssl.SSLContext) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=anthropic.DefaultHttpxClient(
                event_hooks={"response": response_hooks}, verify=tls,
                limits=kept_alive(anthropic._constants.DEFAULT_CONNECTION_LIMITS)),
        )

    def _complete(self, sdk: anthropic.Anthropic, request: ModelRequest) -> ModelResponse:
        body: dict[str, object] = {
            "model": self.model,
            "max_tokens": self._output_limit(request) or DEFAULT_MAX_OUTPUT_TOKENS,
            "messages": to_anthropic_messages(request),
        }
        if request.instructions:
            body["system"] = request.instructions
        tools = to_anthropic_tools(request)
        if tools:
            body["tools"] = tools
        # The SDK's generic POST keeps its retries, timeouts, auth, version
        # header and error mapping; the reply is read by ``from_anthropic_json``
        # (see ``sdk_common.parse_reply`` for why not the SDK's typed reply).
        raw = sdk.post("/v1/messages", cast_to=bytes, body=body,
                       options={"headers": idempotency_headers(request),
                                "idempotency_key": request.idempotency_key})
        return from_anthropic_json(raw)


def to_anthropic_messages(request: ModelRequest) -> list[MessageParam]:
    """The conversation as Anthropic turns, tool results merged into one user turn."""
    out: list[MessageParam] = []
    # Blocks of the user turn being built, while it may still take more tool results.
    open_turn: list[ContentBlockParam] | None = None
    for message in request.messages:
        if message.role == "tool":
            if message.tool_call_id is None:
                raise InvalidInputError("a tool message needs the tool_call_id it answers")
            result: ContentBlockParam = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.is_error,
            }
            if open_turn is None:
                open_turn = [result]
                out.append({"role": "user", "content": open_turn})
            else:
                open_turn.append(result)
        elif message.role == "user" and open_turn is not None:
            # Text may follow the results in their turn; results may not follow text.
            open_turn.append({"type": "text", "text": message.content})
            open_turn = None
        else:
            open_turn = None
            out.append(_to_anthropic_turn(message))
    return out


def _to_anthropic_turn(message: Message) -> MessageParam:
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    blocks: list[ContentBlockParam] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        )
    return {"role": "assistant", "content": blocks or message.content}


def to_anthropic_tools(request: ModelRequest) -> list[ToolParam]:
    """Each ToolSpec as a client tool with its JSON schema."""
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
        for spec in request.tools
    ]


class _WireBlock(WireModel):
    type: str
    text: object = None
    id: object = None
    name: object = None
    input: object = None


class _WireUsage(WireModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _WireMessage(WireModel):
    id: str = ""
    model: str = ""
    content: list[_WireBlock]
    stop_reason: str | None = None
    usage: _WireUsage


def from_anthropic_json(raw: bytes) -> ModelResponse:
    """Text blocks joined, ``tool_use`` blocks as tool calls, other blocks
    (thinking, server tools) skipped; refusals and a full context raise, and a
    body that is not a Messages reply is ``MalformedModelOutputError``."""
    reply = parse_reply(raw, _WireMessage, provider="anthropic", what="a Messages reply")
    if reply.stop_reason == "refusal":
        raise ModelRefusalError(f"anthropic refused (stop_reason=refusal, message {reply.id[:64]})")
    if reply.stop_reason == "model_context_window_exceeded":
        raise ContextLengthError(
            f"anthropic: the model's context window filled up (message {reply.id[:64]})"
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(reply.content):
        if block.type == "text":
            if not isinstance(block.text, str):
                raise MalformedModelOutputError(f"anthropic: text block {index} has no text")
            texts.append(block.text)
        elif block.type == "tool_use":
            if not isinstance(block.id, str) or not isinstance(block.name, str):
                raise MalformedModelOutputError(
                    f"anthropic: tool_use block {index} lacks its id or name")
            arguments = tool_arguments(block.input, provider="anthropic", tool=block.name)
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
    usage = reply.usage
    # Cached prompt tokens are reported apart from input_tokens; all of them were read.
    input_tokens = (
        usage.input_tokens
        + (usage.cache_creation_input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
    )
    return ModelResponse(
        message=Message(role="assistant", content="".join(texts), tool_calls=tuple(calls)),
        usage=Usage(input_tokens=input_tokens, output_tokens=usage.output_tokens),
        model=reply.model,
        stop_reason=reply.stop_reason,
    )
