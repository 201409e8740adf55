"""The runs page: filters, sorting, paging, and counts by status.

Every row comes from ``AgentWorker.search_runs`` (or ``list_runs`` for the
stale filter, which only it has), acting as the visitor: another tenant's runs
are never in the answer, and the tenant filter is honoured for admins only
(the API ignores it for everyone else). The counts by status are one
``GROUP BY`` (``store.runpages``) in the same scope, after the listing has
authorized the visitor to read runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.responses import Response

from agent_worker.api import AgentWorker
from agent_worker.cli.views import run_summary
from agent_worker.console.context import Ctx
from agent_worker.errors import ConfigurationError, InvalidInputError
from agent_worker.steering import parse_labels
from agent_worker.store import runpages, tenancy
from agent_worker.store.sql import SqlStore
from agent_worker.vocabulary import RUN_STATUSES, RunStatus

#: How many stale runs the stale filter looks at (``list_runs`` has no cursor).
STALE_WINDOW = 1000
SORTS: dict[str, tuple[str, bool]] = {
    "newest": ("created_at", True), "oldest": ("created_at", False),
    "updated": ("updated_at", True), "cost": ("cost_micros", True),
    "laps": ("lap", True), "status": ("status", False), "agent": ("agent", False),
}


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
        return cls(status=status, agent=q.get("agent") or None,
                   version=q.get("version") or None, tenant=q.get("tenant") or None,
                   labels=labels, stale=q.get("stale") == "1", failed=q.get("failed") == "1",
                   sort=sort, cursor=q.get("cursor") or None)

    @property
    def effective_status(self) -> RunStatus | None:
        return "failed" if self.failed else self.status

    def link(self, **change: Any) -> str:
        """This query with ``change`` applied, as a query string."""
        values = {"status": self.status, "agent": self.agent, "version": self.version,
                  "tenant": self.tenant, "labels": ",".join(self.labels) or None,
                  "stale": "1" if self.stale else None, "failed": "1" if self.failed else None,
                  "sort": None if self.sort == "newest" else self.sort, "cursor": None}
        values.update(change)
        return "?" + urlencode({k: v for k, v in values.items() if v})


def fetch(aw: AgentWorker, query: RunQuery, page_size: int) -> tuple[list[Any], str | None]:
    """One page of runs and the cursor of the next (None on the last)."""
    labels = parse_labels(list(query.labels)) if query.labels else None
    if query.stale:
        found = aw.list_runs(status=query.effective_status, agent=query.agent,
                             agent_version=query.version, tenant=query.tenant, stale=True,
                             limit=STALE_WINDOW)
        if labels:
            found = [r for r in found if all((r.labels or {}).get(k) == v
                                             for k, v in labels.items())]
        start = int(query.cursor) if query.cursor and query.cursor.isdigit() else 0
        rows = found[start:start + page_size]
        more = start + page_size < len(found)
        return rows, str(start + page_size) if more else None
    page = aw.search_runs(labels=labels, status=query.effective_status, agent=query.agent,
                          agent_version=query.version, tenant=query.tenant,
                          cursor=query.cursor, limit=page_size)
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


def runs_page(ctx: Ctx) -> Response:
    query = RunQuery.parse(ctx.query)
    settings = ctx.console.settings
    runs, next_cursor = fetch(ctx.aw, query, settings.console_page_size)
    at = datetime.now(UTC)
    rows = [run_summary(r, None, at, settings.stale_after_seconds) for r in runs]
    key, reverse = SORTS[query.sort]
    rows.sort(key=lambda r: (r[key] is None, r[key] or 0), reverse=reverse)
    return ctx.render("runs.html", rows=rows, query=query, statuses=RUN_STATUSES,
                      sorts=list(SORTS), counts=counts(ctx.aw, query.tenant),
                      next_link=query.link(cursor=next_cursor) if next_cursor else None,
                      admin=ctx.aw.principal.all_tenants)


__all__ = ["RunQuery", "counts", "fetch", "runs_page"]
