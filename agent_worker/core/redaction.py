"""Removing credentials from text before it is stored or logged.

Tool code quotes what it was given: an ``HTTPError`` carries the URL with its
``appid=...``, a vendor echoes the ``Authorization`` header back. Whatever a tool
returns or raises is written to the effect ledger, the message log and the run
row, and kept for a year (``ledger_retention_days``). ``Agent.redact`` runs over
every string of a tool's result and over its error text before that happens;
``redact_secrets`` is its default. Pass your own function to add shapes, or
``None`` to store tool output untouched.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Redactor = Callable[[str], str]
MASK = "[redacted]"

# Names whose value is a credential, in `name=value` (query strings, form bodies,
# env dumps) and `"name": "value"` (JSON) shapes. `appid`/`app_key` are the
# query-string keys of common weather, maps and search APIs.
_NAMES = (r"api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|id[_-]?token|auth[_-]?token|"
          r"token|secret|client[_-]?secret|password|passwd|pwd|appid|app[_-]?key|"
          r"private[_-]?key|signature|sig|x-api-key")
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer xyz / Basic xyz (headers, curl lines, repr'd dicts).
    (re.compile(r"(?i)\b(bearer\s+|authorization[\"']?\s*[:=]\s*[\"']?basic\s+)"
                r"[A-Za-z0-9._~+/=-]{8,}"), rf"\1{MASK}"),
    # name=value and "name": "value"
    (re.compile(rf"(?i)(?<![A-Za-z0-9_-])((?:{_NAMES})[\"']?\s*[=:]\s*[\"']?)"
                r"[^\s\"'&,;}]+"), rf"\1{MASK}"),
    # Provider key shapes: OpenAI/Anthropic sk-..., Stripe sk_live_/rk_test_, GitHub,
    # Slack, AWS access key ids, Google API keys.
    (re.compile(r"\b(?:sk|rk|pk)[-_](?:live_|test_|proj-|ant-)?[A-Za-z0-9_-]{8,}"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), MASK),
    # https://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+@"), rf"\1{MASK}@"),
)

# What each pattern above cannot match without, in ASCII text: every clause
# (a tuple of substrings, any one of which will do) must occur in the text,
# lowercased for the case-insensitive patterns. Most texts hold no credential,
# and these checks cost a few per cent of running the eight patterns (about
# 60 us for a 400-character tool result). Only ASCII text is screened, because
# Unicode case folding lets ``(?i)secret`` match ``\u017fecret``, which
# lowercasing does not reveal. A mask cannot create a clue: it is bracketed.
_CLUES: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("bearer", "authorization"),),
    (("=", ":"), ("key", "token", "secret", "pass", "pwd", "appid", "sig")),
    (("k-", "k_"),),
    (("gh",), ("_",)),
    (("xox",),),
    (("AKIA",),),
    (("AIza",),),
    (("://",), ("@",)),
)
#: (pattern, replacement, whether its clues are looked for lowercased, clues).
_SCREENED = tuple((pattern, replacement, bool(pattern.flags & re.IGNORECASE), clauses)
                  for (pattern, replacement), clauses in zip(_PATTERNS, _CLUES, strict=True))


def redact_secrets(text: str) -> str:
    """``text`` with common credential shapes replaced by ``[redacted]``."""
    screened = text.isascii()
    lowered = text.lower() if screened else text
    for pattern, replacement, folded, clauses in _SCREENED:
        if screened:
            seen = lowered if folded else text
            if not all(any(c in seen for c in clause) for clause in clauses):
                continue
        text = pattern.sub(replacement, text)
    return text


__all__ = ["MASK", "Redactor", "redact_secrets"]
