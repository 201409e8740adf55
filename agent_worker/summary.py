"""The default summariser: older messages folded into a short extractive text.

Agents name it as their default and the engine only stores what it returns, so
it lives beside the messages it reads, where an agent definition can import it
without importing the engine. It is deterministic and calls no model, so there
is nothing to journal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from agent_worker.core.messages import Message

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


__all__ = ["SUMMARY_LIMIT", "Summarizer", "extractive_summary"]
