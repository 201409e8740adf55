"""Where a model's and a tool's output enter the lap (``agent_worker.core.untrusted``).

Everything here runs before the value is journaled, written to the ledger or
shown to the model, so the first attempt of a lap and any replay act on the
same bytes (a replay reads them back from the store). A value the lap cannot
use is refused the way the model can act on: bad model output is a retriable
model failure; a bad tool result or bad tool arguments become a tool error.
"""

from __future__ import annotations

import json
from typing import Any

from agent_worker.core.errors import (
    MalformedModelOutputError,
    ModelOutputTooLargeError,
    NestingTooDeepError,
)
from agent_worker.core.messages import ModelResponse, ToolCall
from agent_worker.core.redaction import Redactor
from agent_worker.core.settings import Settings
from agent_worker.core.untrusted import clean, clean_text, payload_bytes

#: Key of the stand-in kept instead of a refused value (tool arguments in the
#: journaled model output, a tool result in the ledger): a replay must refuse
#: it again, never hand the stand-in to the model as if it were the value.
REFUSED = "agent_worker_refused"
_PREFIX_CHARS = 1000
#: The most tokens one answer may report using, in or out: far beyond any
#: model's window, far below what the ledger's 64-bit totals hold.
MAX_REPORTED_TOKENS = 2**31 - 1


def model_output(response: ModelResponse, settings: Settings) -> ModelResponse:
    """``response`` under the rule, or a retriable refusal.

    Raises:
        MalformedModelOutputError: not an assistant turn, token usage out of
            range (negative, or past ``MAX_REPORTED_TOKENS``), or nested too deep.
        ModelOutputTooLargeError: over ``max_model_output_bytes`` once cleaned.
    """
    message = response.message
    if message.role != "assistant":
        raise MalformedModelOutputError(f"model returned a {message.role!r} message, "
                                        "not an assistant turn")
    usage = response.usage
    if not all(0 <= n <= MAX_REPORTED_TOKENS for n in (usage.input_tokens, usage.output_tokens)):
        # Charged as reported, a negative count would refund the run's budget,
        # and one past 64 bits would fail the lap commit as a database error.
        raise MalformedModelOutputError(
            "model reported token usage out of range (each count 0 to "
            f"{MAX_REPORTED_TOKENS:,} per answer)")
    depth = settings.max_json_depth
    try:
        calls = tuple(ToolCall(id=clean_text(c.id), name=clean_text(c.name),
                               arguments=_arguments(c.arguments, depth))
                      for c in message.tool_calls)
        meta = clean(message.meta, max_depth=depth, what="model metadata")
    except NestingTooDeepError as e:
        raise MalformedModelOutputError(f"model output: {e}") from e
    cleaned = response.model_copy(update={
        "message": message.model_copy(update={
            "content": clean_text(message.content), "tool_calls": calls, "meta": meta,
            "tool_call_id": None if message.tool_call_id is None
            else clean_text(message.tool_call_id),
            "name": None if message.name is None else clean_text(message.name)}),
        "model": clean_text(response.model),
        "stop_reason": None if response.stop_reason is None
        else clean_text(response.stop_reason)})
    size = len(cleaned.model_dump_json())
    if size > settings.max_model_output_bytes:
        raise ModelOutputTooLargeError(
            f"model output of {size} bytes exceeds the limit of "
            f"{settings.max_model_output_bytes}")
    return cleaned


def _arguments(arguments: dict[str, Any], depth: int) -> dict[str, Any]:
    """Cleaned arguments; too deep, a stand-in the call runner refuses."""
    try:
        value: dict[str, Any] = clean(arguments, max_depth=depth, what="arguments")
    except NestingTooDeepError as e:
        return {REFUSED: str(e)}
    return value


def refusal(value: Any) -> str | None:
    """Why ``value`` (arguments or a ledger result) is a stand-in, if it is one."""
    if isinstance(value, dict) and isinstance(value.get(REFUSED), str):
        return str(value[REFUSED])
    return None


def tool_result(value: Any, settings: Settings, redact: Redactor | None) -> Any:
    """What the ledger keeps of a tool's ``value``: cleaned and redacted, or,
    when too deep or too large, a stand-in with its size and a bounded prefix
    (a 20 MB result must not land in the ledger in full)."""
    if refusal(value) is not None:
        return value
    try:
        kept = clean(value, max_depth=settings.max_json_depth, what="tool result",
                     redact=redact)
    except NestingTooDeepError as e:
        return {REFUSED: f"{e}; return a flatter value"}
    size = payload_bytes(kept)
    limit = settings.max_tool_result_bytes
    if size <= limit:
        return kept
    text = kept if isinstance(kept, str) else json.dumps(kept, ensure_ascii=False)
    return {REFUSED: f"Tool result too large ({size} bytes; limit {limit}). Ask for less.",
            "bytes": size, "prefix": text[:_PREFIX_CHARS]}


def error_text(error: BaseException, settings: Settings, redact: Redactor | None) -> str:
    """A tool error's text as stored and shown: cleaned, redacted, bounded."""
    text = str(clean(describe(error), max_depth=1, redact=redact))
    limit = settings.max_tool_result_bytes
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def describe(error: BaseException) -> str:
    """``str(error)``, even when the exception's own ``__str__`` fails."""
    try:
        return str(error)
    except Exception:
        return f"{type(error).__name__} (its message could not be read)"


__all__ = ["REFUSED", "describe", "error_text", "model_output", "refusal", "tool_result"]
