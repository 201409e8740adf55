"""Values that cross the boundary between the lap engine, the store and a model.

They are frozen and refuse unknown fields: a message is written once to the
append-only log and read back by another process, so it must mean the same thing
on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class Frozen(BaseModel):
    """Base for boundary values: immutable, strict about their fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(Frozen):
    """One tool invocation the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    @cached_property
    def arguments_json(self) -> str:
        """``arguments`` as JSON text, built once: a stored call is in the window
        of up to forty later laps (the lap cache keeps the same object), and
        each lap sizes it (``token_estimate``) and an OpenAI-wire client sends it
        as text. Not a field: it is never stored or compared."""
        return json.dumps(self.arguments)

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Self:
        """A copy; one given other ``arguments`` builds its own text again."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("arguments_json", None)
        return copied


class Usage(Frozen):
    """Tokens one model response consumed."""

    input_tokens: int = 0
    output_tokens: int = 0


class Message(Frozen):
    """One entry of a run's conversation, numbered per run in the message log.

    ``meta`` carries engine annotations, e.g. the range a compaction summary
    replaces; models never see it.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    meta: dict[str, Any] | None = None


def token_estimate(message: Message) -> int:
    """A provider-neutral size of ``message`` in tokens (about 4 bytes a
    token), good enough to bound a model's window; a real count needs the
    provider's tokenizer."""
    return len(message.content) // 4 + sum(len(c.arguments_json) // 4 + 8
                                           for c in message.tool_calls) + 4


class ToolSpec(Frozen):
    """What a model is told about a tool: its name, purpose and JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(Frozen):
    """Everything a model client needs for one call.

    ``idempotency_key`` is ``run:lap:model``; clients that can pass it to their
    provider should, so a retried call is not billed twice where that is offered.
    """

    run_id: str
    lap: int
    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    idempotency_key: str
    max_output_tokens: int | None = None


class ModelResponse(Frozen):
    """The assistant turn a model produced, with what it cost."""

    message: Message
    usage: Usage = Usage()
    model: str = ""
    stop_reason: str | None = None
