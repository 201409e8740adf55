"""A deterministic model for tests, demos and benchmarks: no network, no cost.

The script is a function of the request, so any worker process answers the
same way for the same lap, as a real replay would require."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from agent_worker.core.messages import Message, ModelRequest, ModelResponse, ToolCall, Usage

Script = Callable[[ModelRequest], ModelResponse]


def turn(text: str = "", calls: Sequence[tuple[str, dict[str, Any]]] = (), *,
         usage: tuple[int, int] = (100, 20), call_prefix: str = "call") -> ModelResponse:
    """An assistant turn: final text, or tool calls named with their arguments."""
    return ModelResponse(
        message=Message(role="assistant", content=text, tool_calls=tuple(
            ToolCall(id=f"{call_prefix}_{i}", name=n, arguments=a)
            for i, (n, a) in enumerate(calls))),
        usage=Usage(input_tokens=usage[0], output_tokens=usage[1]), model="scripted")


def model_turns(request: ModelRequest) -> int:
    """How many assistant turns the request's window shows (a lap counter that
    survives pauses, for scripts whose windows are not truncated)."""
    return sum(1 for m in request.messages if m.role == "assistant")


class ScriptedModel:
    """Answers from ``script(request)``; counts its calls (per process)."""

    name = "scripted"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls = 0
        self._counter = itertools.count()

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls = next(self._counter) + 1
        return self.script(request)

    @classmethod
    def by_lap(cls, turns: Sequence[ModelResponse], final: str = "done") -> ScriptedModel:
        """Turn ``lap - 1`` of ``turns`` for each lap, then a final answer."""
        return cls(lambda r: turns[r.lap - 1] if r.lap <= len(turns) else turn(final))
