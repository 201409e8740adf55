"""Compaction: older messages folded into one recorded summary message.

The summary is a stored message (``meta.summary_of = [0, end)``) written by a
lap commit, and the checkpoint points at it, so a resumed run rebuilds exactly
the window the crashed one saw. Summaries are cumulative (each includes the
previous one), so a window needs one summary plus recent messages. The default
summariser is extractive and deterministic: no model call, nothing to journal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from agent_worker.messages import Message
from agent_worker.untrusted import clean_text

Summarizer = Callable[[str | None, Sequence[Message]], str]
SUMMARY_LIMIT = 4000


def extractive_summary(previous: str | None, messages: Sequence[Message]) -> str:
    """What the user asked, then one line per call and result, keeping the
    newest steps when over the size limit."""
    asks: list[str] = []
    steps: list[str] = []
    for line in (previous or "").splitlines():
        (asks if line.startswith("- user:") else steps).append(line)
    for m in messages:
        if m.role == "user":
            asks.append(f"- user: {m.content[:300]}")
        elif m.role == "assistant":
            steps += [f"- called {c.name}({json.dumps(c.arguments, sort_keys=True)[:120]})"
                      for c in m.tool_calls]
            if m.content and not m.tool_calls:
                steps.append(f"- said: {m.content[:160]}")
        elif m.role == "tool":
            steps.append(f"  -> {m.name}: {'ERROR ' if m.is_error else ''}{m.content[:120]}")
    head = "\n".join(asks)[: SUMMARY_LIMIT // 4]
    steps = [s for s in steps if not s.startswith("- (")]
    kept: list[str] = []
    room = SUMMARY_LIMIT - len(head)
    for line in reversed(steps):
        room -= len(line) + 1
        if room < 0:
            break
        kept.append(line)
    omitted = len(steps) - len(kept)
    marker = [f"- ({omitted} earlier steps omitted)"] if omitted else []
    return "\n".join([head, *marker, *reversed(kept)]).strip()


def summary_message(text: str, end: int) -> Message:
    """The stored form of a summary covering messages ``[0, end)``; a custom
    summariser may call a model, so its text is untrusted too."""
    return Message(role="user", content=f"[Summary of the conversation before message {end}]\n"
                   + clean_text(text), meta={"summary_of": [0, end]})


def summary_end(message: Message) -> int:
    """Where the messages a stored summary covers end."""
    return int((message.meta or {}).get("summary_of", [0, 0])[1])
