"""Anthropic's messages API with tool use, through the official SDK.

Why a mapping of its own: Anthropic carries tool calls as ``tool_use`` content blocks of
the assistant turn and tool results as ``tool_result`` blocks of the *next user turn*,
where all results answering one assistant turn must sit together at the start. The
engine's log keeps one message per tool result, so consecutive results are merged here.
"""

from __future__ import annotations

import anthropic
from anthropic.types import (
    ContentBlockParam,
    MessageParam,
    TextBlock,
    ToolParam,
    ToolUseBlock,
)
from anthropic.types import Message as AnthropicMessage

from agent_worker.errors import (
    ContextLengthError,
    InvalidInputError,
    ModelRefusalError,
)
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
complete(AnthropicMessage)

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

    def _new_sdk(self, api_key: str, response_hooks: list[ResponseHook]) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=anthropic.DefaultHttpxClient(
                event_hooks={"response": response_hooks},
                limits=kept_alive(anthropic._constants.DEFAULT_CONNECTION_LIMITS)),
        )

    def _complete(self, sdk: anthropic.Anthropic, request: ModelRequest) -> ModelResponse:
        reply = sdk.messages.create(
            model=self.model,
            max_tokens=self._output_limit(request) or DEFAULT_MAX_OUTPUT_TOKENS,
            system=request.instructions or anthropic.omit,
            messages=to_anthropic_messages(request),
            tools=to_anthropic_tools(request) or anthropic.omit,
            extra_headers=idempotency_headers(request),
        )
        return from_anthropic_message(reply)


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


def from_anthropic_message(reply: AnthropicMessage) -> ModelResponse:
    """Text blocks joined, ``tool_use`` blocks as tool calls; refusals raise."""
    if reply.stop_reason == "refusal":
        raise ModelRefusalError(f"anthropic refused (stop_reason=refusal, message {reply.id})")
    if reply.stop_reason == "model_context_window_exceeded":
        raise ContextLengthError(
            f"anthropic: the model's context window filled up (message {reply.id})"
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in reply.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
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
