"""The one rule for text agent-worker did not write itself.

Models, tools, callers and operators can send any Unicode. Postgres cannot hold
two kinds of it: U+0000 (refused by ``text`` columns, and by ``json`` as soon as
a function unescapes it, as the lap commit's ``json_to_recordset`` does) and
lone surrogates (not encodable as UTF-8 at all; ``os.listdir`` of a non-UTF-8
file name returns them). SQLite accepts the first and chokes on the second.

The rule, the same on both dialects: **every U+0000 and every lone surrogate is
replaced by U+FFFD** in every string of a value (dictionary keys included),
before the value is journaled, stored, hashed or shown to the model. Everything
else (control characters, escape sequences, RTL marks, 4-byte characters) is
stored exactly as sent; the CLI neutralises escapes when it prints.

``clean`` is applied where a value enters the lap (model output, tool results and
errors, signal payloads) and where a caller hands one to ``AgentWorker``, so the
bytes a lap acts on are the bytes a replay reads back. ``clean`` also bounds
nesting depth, so a hostile document gives a clear error instead of a
``RecursionError`` deep inside ``json`` or pydantic.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_worker.core.errors import InvalidInputError, NestingTooDeepError

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A surrogate *pair* cannot occur in a Python str (it would be one code point),
# so every surrogate code point found here is a lone one.


def clean_text(text: str) -> str:
    """``text`` with U+0000 and lone surrogates replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def clean(value: Any, *, max_depth: int, what: str = "value", strict: bool = False,
          redact: Callable[[str], str] | None = None) -> Any:
    """A JSON value following the rule: strings (and keys) cleaned, tuples as
    lists. What JSON cannot hold (NaN, infinities, other objects) is refused
    when ``strict`` (a caller's input), else kept as its cleaned ``str`` (what
    a tool returned). ``redact`` is applied to every string value after cleaning.

    Raises:
        NestingTooDeepError: containers nest deeper than ``max_depth``.
        InvalidInputError: ``strict`` and something is not JSON.
    """
    return _Cleaner(max_depth, what, strict, redact).value(value, 0)


@dataclass(frozen=True)
class _Cleaner:
    limit: int
    what: str
    strict: bool
    redact: Callable[[str], str] | None

    def value(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            text = clean_text(value)
            return clean_text(self.redact(text)) if self.redact is not None else text
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        if isinstance(value, dict | list | tuple):
            # Checked before descending: the recursion never goes past ``limit``.
            if depth >= self.limit:
                raise NestingTooDeepError(f"{self.what}: nested deeper than {self.limit} levels")
            if isinstance(value, dict):
                return {clean_text(str(k)): self.value(v, depth + 1) for k, v in value.items()}
            return [self.value(v, depth + 1) for v in value]
        if self.strict:
            raise InvalidInputError(
                f"{self.what} must be JSON-serialisable; found {type(value).__name__} "
                f"{clean_text(repr(value))[:80]}")
        return self.value(str(value), depth)


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(value: object, what: str, *, max_chars: int = 200) -> str:
    """``value`` if it is a whole identifier: letters, digits, ``.``, ``_``,
    ``-``, starting with a letter or digit, at most ``max_chars``.
    A full match: ``"ticket-1\\n"`` is refused (``$`` would have let it in).

    Raises:
        InvalidInputError: anything else (control characters included).
    """
    if (not isinstance(value, str) or len(value) > max_chars
            or _ID.fullmatch(value) is None):
        shown = repr(clean_text(value))[:80] if isinstance(value, str) else type(value).__name__
        raise InvalidInputError(
            f"{what} must be 1-{max_chars} characters of letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit); got {shown}")
    return value


def check_text(value: object, what: str, *, max_chars: int) -> str:
    """``value`` cleaned, if it is a string of at most ``max_chars`` characters.

    Raises:
        InvalidInputError: not a string, or too long.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > max_chars:
        raise InvalidInputError(f"{what} is {len(value)} characters; the limit is {max_chars}")
    return clean_text(value)


def payload_bytes(value: Any) -> int:
    """Size of a cleaned value as the model reads it: text as is, anything else
    as JSON. Tool results and signal payloads are measured (and limited) by it."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text.encode())


def reduced(text: str, limit: int = 500) -> str:
    """A short, storable form of an error text: cleaned and truncated."""
    text = clean_text(text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


__all__ = ["REPLACEMENT", "check_name", "check_text", "clean", "clean_text", "payload_bytes",
           "reduced"]
