"""What one tool call of a lap comes to (``engine.calls``): a result message
for the model, or a pause until a human, a timer or a signal resumes the run;
and the account of an approval the model reads with an approved call's result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import WaitingFor
from agent_worker.store.base import ApprovalRecord


@dataclass(frozen=True)
class Pause:
    """The run must stop here until a human, a timer or a signal resumes it."""

    status: Literal["waiting", "sleeping"]
    waiting_for: WaitingFor | None
    wake_at: datetime | None
    call: PendingCall
    approval: ApprovalRecord | None = None


@dataclass(frozen=True)
class Done:
    """The call's result message (and the signal it consumed, if any)."""

    message: Message
    signal_id: int | None = None


def result(pc: PendingCall, content: Any, *, error: bool = False) -> Done:
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return Done(Message(role="tool", content=text, tool_call_id=pc.call.id,
                        name=pc.call.name, is_error=error))


def decision(a: ApprovalRecord) -> str:
    """The durable account of a decision, from its record: what, who, when, why."""
    when = f"{a.decided_at:%Y-%m-%d %H:%M:%S} UTC" if a.decided_at else "an unknown time"
    asked = f"{a.requested_at:%Y-%m-%d %H:%M:%S} UTC"
    why = f": {a.comment}" if a.comment else ""
    return (f"{a.status.replace('_', ' ')} by {a.decided_by} at {when} "
            f"(approval requested at {asked}){why}")


def with_decision(done: Done, approval: ApprovalRecord) -> Done:
    """Prefix an approved call's result with who approved it, so a resumed model
    reads the decision from the record instead of inferring (or inventing) it."""
    edited = ("" if approval.approved_arguments is None else
              f" The approver changed its arguments to "
              f"{json.dumps(approval.approved_arguments, sort_keys=True)}.")
    text = (f"Approved call to {approval.tool_name}: {decision(approval)}.{edited} "
            f"Result: {done.message.content}")
    return Done(done.message.model_copy(update={"content": text}), done.signal_id)


__all__ = ["Done", "Pause", "decision", "result", "with_decision"]
