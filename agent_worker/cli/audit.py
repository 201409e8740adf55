"""``agent-worker audit``: who did what, when and why (the append-only audit
log), scoped to the configured principal's tenant."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from agent_worker.cli.common import JsonOpt, client, console, emit_json, jsonable, one_of
from agent_worker.core.authorization import ACTIONS


def audit(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's entries.")] = None,
    principal: Annotated[str | None, typer.Option(help="Only this principal's.")] = None,
    action: Annotated[str | None, typer.Option(
        callback=one_of(ACTIONS), help="Only this action: " + ", ".join(ACTIONS) + ".")]
    = None,
    since: Annotated[datetime | None, typer.Option(
        help="Only entries at or after this time (ISO 8601, UTC).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 100,
    json_out: JsonOpt = False,
) -> None:
    """The audit log, newest first: every start, decision, signal, cancel,
    retry, fork, resolution and budget raise, and every refused attempt."""
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    rows = [jsonable(r) for r in client().audit(principal=principal, action=action,
                                                run_id=run_id, since=since, limit=limit)]
    if json_out:
        emit_json(rows)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "AT", "TENANT", "PRINCIPAL", "ACTION", "OUTCOME", "RUN", "TARGET",
                "REASON", "CHANGES"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["id"]), r["at"], escape(r["tenant"] or ""), escape(r["principal"]),
                      r["action"], r["outcome"] if r["outcome"] == "ok"
                      else f"[red]{r['outcome']}[/]", escape(r["run_id"] or ""),
                      escape(r["target"] or ""), escape((r["reason"] or "")[:60]),
                      escape(json.dumps(r["changes"])[:60]) if r["changes"] else "")
    console.print(table)


__all__ = ["audit"]
