"""OpenAI-compatible chat completions with tool calling, through the official SDK.

Why chat completions: it is the one wire format that OpenAI and the self-hosted servers
users bring (vLLM, Ollama, LiteLLM) all speak, so one client with a configurable
``base_url`` covers them. Tool arguments travel as JSON text on this API; text that is
not a JSON object is the model's fault and ends the lap as malformed output.
"""

from __future__ import annotations

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from agent_worker.errors import InvalidInputError, MalformedModelOutputError, ModelRefusalError
from agent_worker.messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
from agent_worker.model.failures import ProviderFailures
from agent_worker.model.prebuild import complete
from agent_worker.model.sdk_common import (
    ResponseHook,
    SdkModel,
    idempotency_headers,
    kept_alive,
    tool_arguments,
)

# Under the import lock, before a threads worker parses replies concurrently
# (see agent_worker.model.prebuild).
complete(ChatCompletion)

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

    def _new_sdk(self, api_key: str, response_hooks: list[ResponseHook]) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=openai.DefaultHttpxClient(
                event_hooks={"response": response_hooks},
                limits=kept_alive(openai._constants.DEFAULT_CONNECTION_LIMITS)),
        )

    def _complete(self, sdk: openai.OpenAI, request: ModelRequest) -> ModelResponse:
        limit = self._output_limit(request)
        completion = sdk.chat.completions.create(
            model=self.model,
            # The real list travels in ``extra_body`` (see ``wire_body``): the SDK
            # would walk every message of the window through its TypedDict
            # transform, about 15 ms of CPU per lap for a 40-message window.
            messages=[],
            max_completion_tokens=limit if limit is not None else openai.omit,
            extra_headers=idempotency_headers(request),
            extra_body=wire_body(request),
        )
        return from_openai_completion(completion)


def wire_body(request: ModelRequest) -> dict[str, object]:
    """The conversation and tools exactly as they go on the wire.

    Why not the SDK's ``messages=``/``tools=``: the SDK runs each through
    ``maybe_transform``, a recursive walk of the params' TypedDict annotations
    that only renames aliased keys and formats dates/files. What we build here
    holds plain strings, lists and the tools' JSON schemas, which that walk
    returns unchanged (``tests/unit/test_openai_wire.py`` holds us to it), yet
    at 1.4 ms per message it was three quarters of a worker's CPU per lap in
    ``bench.iobound`` (BENCHMARKS.md, "Worker CPU per IO-bound lap").
    ``extra_body`` is the SDK's documented override: its keys win over the
    transformed ones and go out as given.
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


def from_openai_completion(completion: ChatCompletion) -> ModelResponse:
    """The first choice as an assistant turn; refusals raise ``ModelRefusalError``."""
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
        if not isinstance(call, ChatCompletionMessageFunctionToolCall):
            raise MalformedModelOutputError(f"openai: unexpected {call.type} tool call")
        arguments = tool_arguments(
            call.function.arguments, provider="openai", tool=call.function.name
        )
        calls.append(ToolCall(id=call.id, name=call.function.name, arguments=arguments))
    usage = completion.usage
    return ModelResponse(
        message=Message(role="assistant", content=answer.content or "", tool_calls=tuple(calls)),
        usage=Usage(
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        ),
        model=completion.model,
        stop_reason=choice.finish_reason,
    )
