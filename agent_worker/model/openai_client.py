"""OpenAI-compatible chat completions with tool calling, through the official SDK.

Why chat completions: it is the one wire format that OpenAI and the self-hosted servers
users bring (vLLM, Ollama, LiteLLM) all speak, so one client with a configurable
``base_url`` covers them. Tool arguments travel as JSON text on this API; text that is
not a JSON object is the model's fault and ends the lap as malformed output.
"""

from __future__ import annotations

import ssl

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

from agent_worker.core.errors import InvalidInputError, MalformedModelOutputError, ModelRefusalError
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

_TOOL_ERROR_PREFIX = "ERROR: "


class OpenAIChatModel(SdkModel[openai.OpenAI]):
    """A model behind ``POST {base_url}/chat/completions``.

    ``base_url`` defaults to OpenAI's; point it at ``http://host:port/v1`` for vLLM,
    Ollama or LiteLLM. The key comes from ``$<api_key_env>`` or ``api_key_file``.
    """

    provider = "openai"
    failures = ProviderFailures(
        provider="openai",
        api_error=openai.APIError,
        status_error=openai.APIStatusError,
        connection_error=openai.APIConnectionError,
    )

    default_key_env = "OPENAI_API_KEY"

    def _new_sdk(self, api_key: str, response_hooks: list[ResponseHook],
                 tls: ssl.SSLContext) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=openai.DefaultHttpxClient(
                event_hooks={"response": response_hooks}, verify=tls,
                limits=kept_alive(openai._constants.DEFAULT_CONNECTION_LIMITS)),
        )

    def _complete(self, sdk: openai.OpenAI, request: ModelRequest) -> ModelResponse:
        body: dict[str, object] = {"model": self.model, **wire_body(request)}
        limit = self._output_limit(request)
        if limit is not None:
            body["max_completion_tokens"] = limit
        # The SDK's generic POST (its documented way to reach any endpoint)
        # keeps its retries, timeouts, auth and error mapping, and skips two
        # walks the typed ``chat.completions.create`` makes per call: the
        # params' TypedDict transform and the reply's construction into
        # ``ChatCompletion``: 0.57 against 0.78 ms of CPU a call (BENCHMARKS.md,
        # "The model call without the SDK's typed layer").
        raw = sdk.post("/chat/completions", cast_to=bytes, body=body,
                       options={"headers": idempotency_headers(request),
                                "idempotency_key": request.idempotency_key})
        return from_openai_json(raw)


def wire_body(request: ModelRequest) -> dict[str, object]:
    """The conversation and tools exactly as they go on the wire.

    Why not the SDK's ``messages=``/``tools=``: the SDK runs each through
    ``maybe_transform``, a recursive walk of the params' TypedDict annotations
    that only renames aliased keys and formats dates/files. What we build here
    holds plain strings, lists and the tools' JSON schemas, which that walk
    returns unchanged (``tests/unit/test_wire_bodies.py`` holds us to it), yet
    at 1.4 ms per message it was three quarters of a worker's CPU per lap in
    ``bench.iobound`` (BENCHMARKS.md, "Worker CPU per IO-bound lap").
    ``OpenAIChatModel`` posts it through the SDK's generic ``post``, which
    sends a body as given.
    """
    body: dict[str, object] = {"messages": to_openai_messages(request)}
    tools = to_openai_tools(request)
    if tools:
        body["tools"] = tools
    return body


def to_openai_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """Instructions as the system message, then the conversation in OpenAI's shape."""
    out: list[ChatCompletionMessageParam] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for message in request.messages:
        out.append(_to_openai_message(message))
    return out


def _to_openai_message(message: Message) -> ChatCompletionMessageParam:
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    if message.role == "tool":
        if message.tool_call_id is None:
            raise InvalidInputError("a tool message needs the tool_call_id it answers")
        # Chat completions has no error flag on tool results: say it in the text.
        prefix = _TOOL_ERROR_PREFIX if message.is_error else ""
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": prefix + message.content,
        }
    if not message.tool_calls:
        return {"role": "assistant", "content": message.content}
    return {
        "role": "assistant",
        "content": message.content or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for call in message.tool_calls
        ],
    }


def to_openai_tools(request: ModelRequest) -> list[ChatCompletionToolUnionParam]:
    """Each ToolSpec as a ``function`` tool."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        for spec in request.tools
    ]


class _WireFunction(WireModel):
    name: str
    arguments: object = ""  # JSON text on this API; ``tool_arguments`` judges it


class _WireToolCall(WireModel):
    id: str
    type: str = "function"
    function: _WireFunction | None = None


class _WireAnswer(WireModel):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_WireToolCall] | None = None


class _WireChoice(WireModel):
    message: _WireAnswer
    finish_reason: str | None = None


class _WireUsage(WireModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WireCompletion(WireModel):
    choices: list[_WireChoice] = []
    usage: _WireUsage | None = None
    model: str | None = None


def from_openai_json(raw: bytes) -> ModelResponse:
    """The first choice of a chat completion's JSON body as an assistant turn;
    a body that is not one is ``MalformedModelOutputError``, a refusal
    ``ModelRefusalError``."""
    completion = parse_reply(raw, _WireCompletion, provider="openai", what="a chat completion")
    if not completion.choices:
        raise MalformedModelOutputError("openai: the response has no choices")
    choice = completion.choices[0]
    answer = choice.message
    if answer.refusal or choice.finish_reason == "content_filter":
        raise ModelRefusalError(
            f"openai refused (finish_reason={choice.finish_reason}): {answer.refusal or ''}"
        )
    calls: list[ToolCall] = []
    for call in answer.tool_calls or ():
        if call.type != "function" or call.function is None:
            raise MalformedModelOutputError(f"openai: unexpected {call.type[:40]} tool call")
        arguments = tool_arguments(
            call.function.arguments, provider="openai", tool=call.function.name
        )
        calls.append(ToolCall(id=call.id, name=call.function.name, arguments=arguments))
    usage = completion.usage or _WireUsage()
    return ModelResponse(
        message=Message(role="assistant", content=answer.content or "", tool_calls=tuple(calls)),
        usage=Usage(input_tokens=usage.prompt_tokens or 0,
                    output_tokens=usage.completion_tokens or 0),
        model=completion.model or "",
        stop_reason=choice.finish_reason,
    )
