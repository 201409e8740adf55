"""The run's decisions on its page: every approval asked, who decided it,
when, with what comment, and how the approved arguments differ from the
ones the model proposed (an approver may edit them before approving)."""

from __future__ import annotations

import json
from typing import Any

from agent_worker.store.base import ApprovalRecord


def history(found: list[ApprovalRecord]) -> list[dict[str, Any]]:
    """The run's approvals (``store.runpanels.run_approvals``, read after the
    visitor was let read the run), each with its argument diff."""
    return [{"approval": a, "diff": diff(a.arguments, a.approved_arguments)} for a in found]


def diff(proposed: dict[str, Any], approved: dict[str, Any] | None) -> list[dict[str, str]]:
    """Top-level arguments the approver changed: ``{"name", "proposed",
    "approved"}`` as JSON text (``""`` for an argument one side lacks);
    empty when approved as proposed."""
    if approved is None:
        return []
    changed = []
    for name in sorted(set(proposed) | set(approved)):
        before, after = proposed.get(name, _MISSING), approved.get(name, _MISSING)
        if before != after:
            changed.append({"name": name, "proposed": _text(before), "approved": _text(after)})
    return changed


_MISSING = object()


def _text(value: Any) -> str:
    return "" if value is _MISSING else json.dumps(value, ensure_ascii=False, sort_keys=True,
                                                   default=str)


__all__ = ["diff", "history"]
