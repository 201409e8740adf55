"""What the model sees: built from durable records only, so a resumed run sees
the same window as the run that crashed. Loading reads only the recent
messages (the store's claim query starts at the window), never the history."""

from __future__ import annotations

import json

from agent_worker.agent import Agent
from agent_worker.core.checkpoint import Checkpoint
from agent_worker.core.messages import Message, ModelRequest
from agent_worker.engine.compaction import summary_end
from agent_worker.store.base import StoredMessage


def build_request(agent: Agent, run_id: str, lap: int, checkpoint: Checkpoint,
                  window: list[StoredMessage], key: str) -> ModelRequest:
    """The model's input for ``lap``: instructions, pinned facts and plan, the
    latest compaction summary if any, then recent messages within the agent's
    message and token limits."""
    summary = next((m for m in window if m.seq == checkpoint.summary_seq), None)
    covered = summary_end(summary.message) if summary is not None else 0
    # The claim may load more than this agent's window (it serves every agent);
    # cut to the agent's own message limit first, then to its token limit.
    stored = [m for m in window if m.seq >= covered and m is not summary]
    budget = agent.window_tokens
    kept: list[Message] = []
    used = 0
    for m in reversed(stored[-agent.window_messages:]):
        used += m.tokens
        if used > budget and kept:
            break
        kept.append(m.message)
    kept.reverse()
    # A window must not open on tool results whose call it no longer shows.
    while kept and kept[0].role == "tool":
        kept.pop(0)
    if summary is not None:
        kept.insert(0, summary.message.model_copy(update={"meta": None}))
    instructions = agent.instructions
    if checkpoint.facts:
        instructions += "\n\nPinned facts:\n" + json.dumps(checkpoint.facts, sort_keys=True)
    if checkpoint.plan:
        instructions += "\n\nPlan:\n" + "\n".join(
            f"{i}. [{'x' if p.done else ' '}] {p.title}"
            for i, p in enumerate(checkpoint.plan, 1))
    if checkpoint.next_action:
        instructions += "\n\nNext planned action: " + checkpoint.next_action
    return ModelRequest(run_id=run_id, lap=lap, instructions=instructions,
                        messages=tuple(kept), tools=tuple(t.spec for t in agent.tools),
                        idempotency_key=key)
