"""Compaction: older messages folded into one recorded summary message.

The summary is a stored message (``meta.summary_of = [0, end)``) written by a
lap commit, and the checkpoint points at it, so a resumed run rebuilds exactly
the window the crashed one saw. Summaries are cumulative (each includes the
previous one), so a window needs one summary plus recent messages. The default
summariser (``agent_worker.summary``) is extractive and deterministic.
"""

from __future__ import annotations

from agent_worker.core.messages import Message
from agent_worker.core.untrusted import clean_text


def summary_message(text: str, end: int) -> Message:
    """The stored form of a summary covering messages ``[0, end)``; a custom
    summariser may call a model, so its text is untrusted too."""
    return Message(role="user", content=f"[Summary of the conversation before message {end}]\n"
                   + clean_text(text), meta={"summary_of": [0, end]})


def summary_end(message: Message) -> int:
    """Where the messages a stored summary covers end."""
    return int((message.meta or {}).get("summary_of", [0, 0])[1])
