"""The approvals inbox and the decision it posts.

The inbox lists pending approvals of the visitor's tenant, oldest first. Each
is shown "for you" when the API's authorizer lets the visitor decide it (its
roles grant approve and it is a member of the approval's owner), else "for
others", read-only. The decision goes to ``AgentWorker.approve``/``reject``
acting as the visitor, so a forged POST from someone the authorizer refuses
gets the API's ``PermissionDeniedError`` (a 403 page, and an audit entry),
whatever the page showed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from starlette.responses import RedirectResponse, Response

from agent_worker.api import AgentWorker
from agent_worker.console.context import Ctx, form_json
from agent_worker.console.views import Pager
from agent_worker.core.authorization import AccessRequest
from agent_worker.core.errors import InvalidInputError, UnknownAgentError
from agent_worker.store.base import ApprovalRecord, RunRecord


def _call_lap(a: ApprovalRecord) -> int | None:
    """The lap that asked the call: its effect key is ``run:lap:call``."""
    parts = a.effect_key.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def approval_card(ctx: Ctx, a: ApprovalRecord, run: RunRecord) -> dict[str, Any]:
    """An approval with what the approver needs to decide it."""
    aw = ctx.aw
    lap = _call_lap(a)
    reasoning = next((m.message.content for m in aw.messages(run.id)
                      if m.lap == lap and m.message.role == "assistant"), None)
    description = None
    try:
        tool = aw.rt.registry.get(run.agent_name, run.agent_version).tool(a.tool_name)
        description = tool.description if tool is not None else None
    except UnknownAgentError:
        pass  # an agent this console process did not import: no description
    return {"a": a, "run": run, "lap": lap, "reasoning": reasoning,
            "description": description, "mine": decidable(aw, a, run.tenant),
            "arguments": json.dumps(a.arguments, indent=2, ensure_ascii=False, sort_keys=True)}


def decidable(aw: AgentWorker, a: ApprovalRecord, tenant: str | None) -> bool:
    """Whether ``aw``'s principal may decide ``a`` (of a run in ``tenant``):
    the API's own authorizer, asked without acting (no audit entry)."""
    owners = tuple(o for o in (a.owner, a.escalate_to) if o)
    return aw.authorizer(aw.principal, AccessRequest("approve", tenant, a.run_id, owners))


def waiting(aw: AgentWorker) -> dict[str, Any]:
    """The pending approvals the principal sees: how many it may decide
    (``mine``: the header's badge), how many it may not (``others``), and a
    ``digest`` of which they are (the inbox re-renders when it changes). One
    read of the pending approvals of its tenant; an admin's, across tenants,
    reads each run's tenant once."""
    tenants: dict[str, str | None] = {}
    found: dict[str, Any] = {"mine": 0, "others": 0}
    pending = aw.list_approvals(status="pending")
    for a in pending:
        if a.run_id not in tenants:
            tenants[a.run_id] = (aw.get_run(a.run_id).tenant if aw.principal.all_tenants
                                 else aw.principal.tenant)
        found["mine" if decidable(aw, a, tenants[a.run_id]) else "others"] += 1
    found["digest"] = digest(a.id for a in pending)
    return found


def digest(approval_ids: Iterable[str]) -> str:
    """Which approvals are pending, in a few characters."""
    raw = "\n".join(sorted(approval_ids))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def inbox(ctx: Ctx) -> Response:
    aw = ctx.aw
    runs: dict[str, RunRecord] = {}
    cards = []
    for a in aw.list_approvals(status="pending"):
        if a.run_id not in runs:
            runs[a.run_id] = aw.get_run(a.run_id)
        cards.append(approval_card(ctx, a, runs[a.run_id]))
    size = ctx.console.settings.console_page_size
    mine = [c for c in cards if c["mine"]]
    others = [c for c in cards if not c["mine"]]
    # Oldest first: the page shows the reversed newest-first pages.
    return ctx.render("approvals.html", digest=digest(c["a"].id for c in cards),
                      mine=_oldest_first(Pager.of(mine[::-1], ctx.query, "page", size)),
                      others=_oldest_first(Pager.of(others[::-1], ctx.query, "others", size)),
                      notice=DECIDED.get(ctx.query.get("done") or ""), page_link=ctx.page_link)


def _oldest_first(pager: Pager[Any]) -> Pager[Any]:
    return Pager(pager.items[::-1], pager.page, pager.pages, pager.total, pager.param)


#: A decision, the ``done`` it redirects back to the inbox with, and what the inbox then says.
OUTCOMES = {"approve": "approved", "reject": "rejected"}
DECIDED = {"approved": "Approved.", "rejected": "Rejected."}


def decide(ctx: Ctx) -> Response:
    """POST: ``decision`` approve|reject, optional ``comment`` and, to approve with
    edited arguments, ``arguments`` (a JSON object) differing from the model's."""
    approval_id = ctx.request.path_params["approval_id"]
    decision = ctx.form.get("decision")
    comment = (ctx.form.get("comment") or "").strip() or None
    if decision == "reject":
        ctx.aw.reject(approval_id, comment=comment)
    elif decision == "approve":
        ctx.aw.approve(approval_id, comment=comment, arguments=_edited(ctx))
    else:
        raise InvalidInputError("decision must be approve or reject")
    return RedirectResponse(f"/approvals?done={OUTCOMES[decision]}", status_code=303)


def _edited(ctx: Ctx) -> dict[str, Any] | None:
    """The approver's arguments, if they changed the model's; None to approve as asked."""
    raw = (ctx.form.get("arguments") or "").strip()
    original = (ctx.form.get("original_arguments") or "").strip()
    if not raw or raw == original:
        return None
    value = form_json(raw, "edited arguments")
    if not isinstance(value, dict):
        raise InvalidInputError("edited arguments must be a JSON object")
    if original:
        with contextlib.suppress(InvalidInputError):
            if value == form_json(original, "original arguments"):
                return None
    return value


__all__ = ["approval_card", "decidable", "decide", "digest", "inbox",
           "waiting"]
