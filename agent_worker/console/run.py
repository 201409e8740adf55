"""The run page: header, budget, lap timeline, messages, effect ledger,
plan, family, events, the error of a failed run; and the live fragment the
page re-fetches while the run moves.

Everything is read through the API acting as the visitor (``get_run`` first:
another tenant's run is a 404 before anything else is read). Long lists are
paged on the server (``Pager``), so a run of 500 laps renders one page of each.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from starlette.responses import Response

from agent_worker.console import decisions, timeline
from agent_worker.console.applicable import applies, waited_effect, waited_ref
from agent_worker.console.context import Ctx
from agent_worker.console.tree import AXIS_PX, family
from agent_worker.console.views import Pager, duration, lap_rows, money, page_number, pages
from agent_worker.core.authorization import AccessRequest, Action
from agent_worker.core.constants import LAP_TASK_NAME
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.store import runpages, runpanels, tenancy
from agent_worker.store.base import EventRecord, RunRecord
from agent_worker.store.sql import SqlStore

__all__ = ["allowed_actions", "live_fragment", "run_page"]

#: The run verbs the console offers, each shown only when the authorizer allows it
#: (and refused by the API if posted anyway).
RUN_VERBS: tuple[Action, ...] = ("cancel", "signal", "retry", "fork", "resolve",
                                  "raise_budget")


def allowed_actions(ctx: Ctx, run: RunRecord) -> list[str]:
    """The verbs the visitor's roles allow on ``run`` (the API's authorizer)
    that can apply to it as it stands (``console.applicable``)."""
    principal = ctx.aw.principal
    return [v for v in RUN_VERBS if applies(v, run)
            and ctx.aw.authorizer(principal, AccessRequest(v, run.tenant, run.id))]


def run_view(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """What the page and its live fragment render: one page of each list,
    read as one window (``store.runpages``) so a long run costs what a short
    one does."""
    aw, q = ctx.aw, ctx.query
    size = ctx.console.settings.console_page_size
    run = aw.get_run(run_id)  # the visitor may read it: everything below is this run's
    state = aw.get_state(run.id)
    store = aw.rt.store
    if not isinstance(store, SqlStore):
        raise ConfigurationError("the run console needs the SQL store")
    lap_page = page_number(q, "laps", run.lap, size)
    last = run.lap - (lap_page - 1) * size
    with tenancy.scope(aw.principal.tenant):
        w = runpages.run_window(
            store, run.id, first=max(1, last - size + 1), last=last,
            messages_page=_asked(q, "messages", size), events_page=_asked(q, "events", size),
            effects_page=_asked(q, "effects", size))
        gaps = runpanels.gap_events(
            store, run.id, first=max(1, last - size + 1), last=last,
            until=_last_commit(w.commits) if last < run.lap else None)
        asked = runpanels.run_approvals(store, run.id)
    events = Pager(w.events[0], w.events[2], pages(w.events[1], size), w.events[1], "events")
    failing = None
    if run.status == "failed" or run.error_code:
        failing = {"lap": run.next_lap, "code": run.error_code, "message": run.error_message,
                   "detail": run.error_detail,
                   "events": [e for e in events.items if e.lap == run.next_lap][:5]}
    plan = list(state.plan)
    currency = ctx.console.settings.console_currency
    now = aw.rt.clock.now()
    return {
        "run": run, "state": state,
        "budget": budget(run, state.budget, currency, now),
        "timeline": timeline.picture(run, w.commits, gaps, now),
        "cost": money(aw.cost(run), currency), "laps_charged": run.laps_used,
        "finished": run.status in TERMINAL, "failing": failing,
        "laps": Pager(lap_rows(run.id, w.commits, w.lap_messages, w.lap_effects), lap_page,
                      pages(run.lap, size), run.lap, "laps"),
        "messages": Pager(w.messages[0], w.messages[2], pages(w.messages[1], size),
                          w.messages[1], "messages"),
        "effects": Pager(w.effects[0], w.effects[2], pages(w.effects[1], size),
                         w.effects[1], "effects"),
        "events": events,
        "plan": plan, "plan_done": sum(1 for p in plan if p.done),
        "family": family(aw, run, limit=size), "axis_px": AXIS_PX,
        "decisions": decisions.history(asked),
        "approval_link": waited_ref(run, "approval"),
        "actions": allowed_actions(ctx, run),
        "waited_effect": waited_effect(run),
        "flower_run": flower_laps(ctx.console.settings.console_flower_url, run.id),
        "poll_ms": int(ctx.console.settings.console_poll_seconds * 1000),
        "query": str(ctx.request.url.query),
        "page_link": ctx.page_link,
        "request_notice": NOTICES.get(q.get("done") or ""),
    }


def _last_commit(commits: list[EventRecord]) -> datetime | None:
    return max((c.created_at for c in commits), default=None)


def _asked(query: Any, param: str, size: int) -> runpages.Page:
    """The page ``query[param]`` asks for (the store clamps it to the last)."""
    return runpages.Page(page_number(query, param, 10**9, size), size)


#: What the page says after an action redirected back to it.
NOTICES = {"cancel": "Cancel requested.", "signal": "Signal sent.", "retry": "Retry queued.",
           "fork": "Forked: this is the new run.", "resolve": "Effect resolved.",
           "raise_budget": "Budget raised: the run resumes."}


def flower_laps(flower_url: str, run_id: str) -> str:
    """Flower's tasks page showing this run's laps alone.

    Flower 2.2's tasks page fills its search box from the ``state``,
    ``worker`` and ``name`` query parameters only (each as ``key:value``; a
    ``search`` parameter is ignored), so the run's filter rides in ``name``
    after the lap task's name: the box then reads ``name:agent_worker.run_lap
    kwargs:run_id=<id>``, the laps whose kwargs hold that run id (laps are
    sent with ``run_id`` as a keyword, ``tasks.dispatch``). A run id has no
    space or quote to escape (``untrusted.check_name``). The space is ``%20``:
    the page decodes the parameter with ``decodeURIComponent``, which leaves a
    ``+`` as it is."""
    search = f"{LAP_TASK_NAME} kwargs:run_id={run_id}"
    return f"{flower_url.rstrip('/')}/tasks?name={quote(search, safe='')}"


def budget(run: RunRecord, ledger: dict[str, Any], currency: str,
           now: datetime) -> list[dict[str, Any]]:
    """Used against limit (``None``: unlimited), as text, per resource the
    budget limits. Laps are the laps charged to the budget, the ones that
    called the model (``budget.BudgetLedger``): a lap that only ran calls
    held for an approval or a signal is committed but not charged, so the
    count can be below the run's committed laps (the header says both).
    The deadline row is wall-clock time since the run started against the
    time it was given."""
    limits = run.limits or {}
    max_cost = limits.get("max_cost")
    rows: list[dict[str, Any]] = [
        {"name": "laps", "used": str(run.laps_used), "limit": _count(limits.get("max_laps"))},
        {"name": "input tokens", "used": str(run.input_tokens),
         "limit": _count(limits.get("max_input_tokens"))},
        {"name": "output tokens", "used": str(run.output_tokens),
         "limit": _count(limits.get("max_output_tokens"))},
        {"name": "cost", "used": money(Decimal(run.cost_micros) / 1_000_000, currency),
         "limit": None if max_cost is None else money(max_cost, currency)},
    ]
    started, deadline = _instant(ledger.get("started_at")), _instant(ledger.get("deadline"))
    if started is not None:
        until = run.finished_at or now
        rows.append({
            "name": "deadline", "used": duration((until - started).total_seconds()),
            "limit": None if deadline is None else duration(
                (deadline - started).total_seconds()),
            "deadline": deadline})
    return rows


def _count(limit: Any) -> str | None:
    return None if limit is None else str(limit)


def _instant(value: Any) -> datetime | None:
    """A ledger time (ISO text in the state view) as an aware datetime."""
    if value is None or isinstance(value, datetime):
        return value
    at = datetime.fromisoformat(str(value))
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def run_page(ctx: Ctx) -> Response:
    return ctx.render("run.html", **run_view(ctx, ctx.request.path_params["run_id"]))


def live_fragment(ctx: Ctx) -> Response:
    """The page's body alone, for the live refresh (``static/console.js``)."""
    return ctx.render("run_body.html", **run_view(ctx, ctx.request.path_params["run_id"]))
