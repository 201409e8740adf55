"""The runs page: search, filters, sorting, paging, and counts by status.

Every row comes from ``AgentWorker.search_runs`` (or ``list_runs`` for the
stale filter, which only it has), acting as the visitor: another tenant's runs
are never in the answer, and the tenant filter is honoured for admins only
(the API ignores it for everyone else). The counts by status are one
``GROUP BY`` (``store.runpages``) in the same scope, after the listing has
authorized the visitor to read runs.

The search box is the API's ``text`` (run id prefix, agent, label value,
error text), except ``key=value``, which is a label filter (an index walk).
Creation order (newest, oldest) is the listing's own, across pages; the other
sorts have no index on a million-run table and order the page shown.

``digest`` is what the live stream (``console.stream``) compares to tell a
page that its rows changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.responses import Response

from agent_worker.api import AgentWorker
from agent_worker.cli.common import span
from agent_worker.cli.views import run_summary
from agent_worker.console.applicable import waited_ref
from agent_worker.console.context import Ctx
from agent_worker.core.errors import ConfigurationError, InvalidInputError
from agent_worker.core.vocabulary import RUN_STATUSES, TERMINAL, RunStatus
from agent_worker.steering import parse_labels
from agent_worker.store import runpages, tenancy
from agent_worker.store.base import RunRecord
from agent_worker.store.sql import SqlStore

#: How many stale runs the stale filter looks at (``list_runs`` has no cursor).
STALE_WINDOW = 1000
#: Sort name: (row key, descending). The first two are the store's order,
#: across pages (``STORE_SORTS``); the others order the page shown.
SORTS: dict[str, tuple[str, bool]] = {
    "newest": ("created_at", True), "oldest": ("created_at", False),
    "updated": ("updated_at", True), "cost": ("cost_micros", True),
    "laps": ("lap", True), "duration": ("duration_seconds", True),
    "status": ("status", False), "agent": ("agent", False),
}
STORE_SORTS = ("newest", "oldest")


@dataclass(frozen=True)
class RunQuery:
    """The filters of the runs page, parsed from its query string."""

    status: RunStatus | None = None
    agent: str | None = None
    version: str | None = None
    tenant: str | None = None
    labels: tuple[str, ...] = ()
    stale: bool = False
    failed: bool = False
    sort: str = "newest"
    cursor: str | None = None
    text: str | None = None

    @classmethod
    def parse(cls, q: Any) -> RunQuery:
        """Raises ``InvalidInputError`` for a status or sort that does not exist."""
        status = q.get("status") or None
        if status is not None and status not in RUN_STATUSES:
            raise InvalidInputError(f"unknown status {status[:40]!r}")
        sort = q.get("sort") or "newest"
        if sort not in SORTS:
            raise InvalidInputError(f"unknown sort {sort[:40]!r}; one of {', '.join(SORTS)}")
        labels = tuple(x.strip() for x in (q.get("labels") or "").split(",") if x.strip())
        text = (q.get("q") or "").strip() or None
        return cls(status=status, agent=q.get("agent") or None,
                   version=q.get("version") or None, tenant=q.get("tenant") or None,
                   labels=labels, stale=q.get("stale") == "1", failed=q.get("failed") == "1",
                   sort=sort, cursor=q.get("cursor") or None, text=text)

    @property
    def effective_status(self) -> RunStatus | None:
        return "failed" if self.failed else self.status

    def link(self, **change: Any) -> str:
        """This query with ``change`` applied, as a query string."""
        values = {"q": self.text, "status": self.status, "agent": self.agent,
                  "version": self.version,
                  "tenant": self.tenant, "labels": ",".join(self.labels) or None,
                  "stale": "1" if self.stale else None, "failed": "1" if self.failed else None,
                  "sort": None if self.sort == "newest" else self.sort, "cursor": None}
        values.update(change)
        return "?" + urlencode({k: v for k, v in values.items() if v})


    def searched(self) -> tuple[dict[str, str], str | None]:
        """The labels to filter by and the API's search text: a box holding
        ``key=value`` adds that label (indexed) instead of searching text.

        Raises:
            InvalidInputError: a malformed label.
        """
        labels = parse_labels(list(self.labels)) if self.labels else {}
        text = self.text
        if text is not None and "=" in text and " " not in text:
            key, _, value = text.partition("=")
            if key in labels and labels[key] != value:
                raise InvalidInputError(f"label {key[:40]!r} asked twice with two values")
            labels.update(parse_labels([text]))
            text = None
        return labels, text


def fetch(aw: AgentWorker, query: RunQuery, page_size: int) -> tuple[list[Any], str | None]:
    """One page of runs and the cursor of the next (None on the last)."""
    labels, text = query.searched()
    if query.stale:
        found = aw.list_runs(status=query.effective_status, agent=query.agent,
                             agent_version=query.version, tenant=query.tenant, stale=True,
                             limit=STALE_WINDOW)
        if text is not None:  # the stale runs among the search's (one window of it)
            stale_ids = {r.id for r in found}
            found = [r for r in aw.search_runs(text=text, tenant=query.tenant,
                                               limit=STALE_WINDOW).runs if r.id in stale_ids]
        if labels:
            found = [r for r in found if all((r.labels or {}).get(k) == v
                                             for k, v in labels.items())]
        start = int(query.cursor) if query.cursor and query.cursor.isdigit() else 0
        rows = found[start:start + page_size]
        more = start + page_size < len(found)
        return rows, str(start + page_size) if more else None
    page = aw.search_runs(labels=labels or None, status=query.effective_status,
                          agent=query.agent, agent_version=query.version, tenant=query.tenant,
                          cursor=query.cursor, limit=page_size, text=text,
                          oldest=query.sort == "oldest")
    return list(page.runs), page.next_cursor


def counts(aw: AgentWorker, tenant: str | None) -> dict[str, int]:
    """Runs per status in the visitor's scope (one GROUP BY; call after an API
    read has authorized the visitor to read runs)."""
    store = aw.rt.store
    if not isinstance(store, SqlStore):
        raise ConfigurationError("the run console needs the SQL store")
    scope = tenant if aw.principal.all_tenants else aw.principal.tenant
    with tenancy.scope(aw.principal.tenant):
        found = runpages.status_counts(store, scope)
    return {s: found.get(s, 0) for s in RUN_STATUSES}


def row(run: RunRecord, at: datetime, stale_after: float) -> dict[str, Any]:
    """A run as the list shows it: ``runs list``'s summary, its labels, how
    long it ran (until now while it has not ended), and the approval a run
    waiting for one waits for (the inbox links to it by id)."""
    summary = run_summary(run, None, at, stale_after)
    ended = run.finished_at if run.status in TERMINAL else None
    summary["duration_seconds"] = max(0.0, ((ended or at) - run.created_at).total_seconds())
    summary["duration"] = span(summary["duration_seconds"])
    summary["labels"] = sorted((run.labels or {}).items())
    summary["approval_id"] = waited_ref(run, "approval")
    return summary


def listed(ctx: Ctx, query: RunQuery) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of one page in the query's order, and the next page's cursor."""
    settings = ctx.console.settings
    runs, next_cursor = fetch(ctx.aw, query, settings.console_page_size)
    at = datetime.now(UTC)
    rows = [row(r, at, settings.stale_after_seconds) for r in runs]
    if query.sort not in STORE_SORTS:
        key, reverse = SORTS[query.sort]
        rows.sort(key=lambda r: (r[key] is None, r[key] or 0), reverse=reverse)
    return rows, next_cursor


def digest(rows: list[dict[str, Any]]) -> str:
    """What the page's rows show that can change: each row's id, status, lap,
    cost, wait and error (not the durations, which tick). Not the counts by
    status: a ``GROUP BY`` over the tenant's runs, too dear to repeat every
    poll on a big table; they are re-read with the rows when those change."""
    shown = [[r["id"], r["status"], r["lap"], r["cost_micros"], r["waiting_for"],
              r["error_code"], r["stale"]] for r in rows]
    raw = json.dumps(shown, default=str, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def runs_page(ctx: Ctx) -> Response:
    query = RunQuery.parse(ctx.query)
    rows, next_cursor = listed(ctx, query)
    return ctx.render("runs.html", rows=rows, query=query, statuses=RUN_STATUSES,
                      sorts=list(SORTS), counts=counts(ctx.aw, query.tenant),
                      digest=digest(rows),
                      live_query=query.link(cursor=query.cursor)[1:],
                      next_link=query.link(cursor=next_cursor) if next_cursor else None,
                      admin=ctx.aw.principal.all_tenants)


__all__ = ["STORE_SORTS", "RunQuery", "counts", "digest", "fetch", "listed", "row",
           "runs_page"]
