"""Human output: rich tables and panels built from the dicts in ``views``
(the same data ``--json`` prints, so the two never disagree)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_worker.cli.common import ago, span, styled_status
from agent_worker.core.vocabulary import TERMINAL

BAR = 12


def bar(done: int, total: int, width: int = BAR) -> str:
    filled = round(width * done / total) if total else 0
    return "█" * filled + "░" * (width - filled)


def _plan_cell(plan: dict[str, Any] | None) -> str:
    if not plan:
        return "[dim]-[/]"
    return f"{bar(plan['done'], plan['total'], 8)} {plan['done']}/{plan['total']}"


def _t(value: Any) -> datetime | None:
    if isinstance(value, datetime) or value is None:
        return value
    return datetime.fromisoformat(str(value))


def runs_table(rows: Sequence[dict[str, Any]], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("RUN", "AGENT", "TENANT", "STATUS", "LAP", "PLAN", "WAITING FOR",
                "LAST CKPT", "COST", "AGE"):
        table.add_column(col, no_wrap=col != "WAITING FOR")
    for r in rows:
        since = ago(_t(r["last_checkpoint_at"]), at)
        if r["stale"]:
            since = f"[bold red]{since} stale[/]"
        waiting = r["waiting_for"] or ""
        if r["status"] == "sleeping" and r["wake_at"]:
            waiting = f"until +{span(_t(r['wake_at']) - at)}"  # type: ignore[operator]
        waiting = escape(waiting)  # data: its brackets are text, not markup
        if r["status"] == "failed" and r["error_code"]:
            waiting = f"[red]{escape(r['error_code'])}[/]"
        table.add_row(escape(r["id"]), escape(f"{r['agent']}@{r['agent_version']}"),
                      escape(r["tenant"] or ""), styled_status(r["status"]), str(r["lap"]),
                      _plan_cell(r["plan"]), waiting, since, r["cost"],
                      ago(_t(r["created_at"]), at))
    return table


def batch_header(rows: Sequence[dict[str, Any]]) -> Text:
    """``12 runs · 8 succeeded · 3 running  ████░░ 67% finished``"""
    counts = Counter(r["status"] for r in rows)
    finished = sum(counts[s] for s in TERMINAL)
    parts = [f"{len(rows)} runs"] + [f"{n} {s}" for s, n in sorted(counts.items())]
    pct = 100 * finished / len(rows) if rows else 100.0
    return Text.from_markup(" · ".join(parts)
                            + f"   {bar(finished, len(rows) or 1, 20)} {pct:.0f}% finished")


def run_panel(d: dict[str, Any], at: datetime) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()

    def row(k: str, v: Any) -> None:
        # Text, not markup: values are data (a plan step or a result's ``[x]``
        # is printed as it is); a styled value is passed as ``Text`` already.
        if v not in (None, "", [], {}):
            grid.add_row(k, v if isinstance(v, Text) else Text(str(v)))

    row("status", Text.from_markup(styled_status(d["status"])
                                   + (" [bold red](stale)[/]" if d["stale"] else "")))
    row("agent", f"{d['agent']}@{d['agent_version']}")
    row("tenant", d["tenant"])
    row("lap", f"{d['lap']} committed (next {d['next_lap']}, attempt {d['lap_attempts']})")
    if d["plan"]:
        p = d["plan"]
        row("plan", f"{bar(p['done'], p['total'])} {p['done']}/{p['total']}"
                    + (f" - next: {p['next']}" if p["next"] else ""))
    row("last checkpoint", f"{ago(_t(d['last_checkpoint_at']), at)} ago")
    row("waiting for", d["waiting_for"])
    if d.get("throttled"):
        row("throttled", "waiting for a fair-share slot (no message in Redis; "
                         "`agent-worker queues`)")
    if d.get("priority"):
        row("priority", d["priority"])
    if d["wake_at"]:
        row("wakes", f"{d['wake_at']} (in {span(_t(d['wake_at']) - at)})")  # type: ignore[operator]
    b = d["budget"]
    used = [f"laps {b['laps']['used']}/{b['laps']['limit'] or '∞'}",
            f"tokens in {b['input_tokens']['used']}/{b['input_tokens']['limit'] or '∞'}",
            f"out {b['output_tokens']['used']}/{b['output_tokens']['limit'] or '∞'}",
            f"cost {b['cost']['used']}/{b['cost']['limit'] or '∞'}"]
    row("budget", "  ".join(used) + (f"  deadline {b['deadline']}" if b["deadline"] else ""))
    if d["lease"]:
        row("lease", f"{d['lease']['owner']} (expires in {d['lease']['expires_in_seconds']}s)")
    for a in d["pending_approvals"]:
        row("approval", f"{a['id']}: {a['tool']} {json.dumps(a['arguments'])} "
                        f"(owner {a['owner'] or '-'}, {span(a['age_seconds'])} old)")
    for p in d.get("progress") or []:
        row("progress", Text(f"call {p['call']} {p['tool']}: "
                             f"{json.dumps(p['progress'], ensure_ascii=False)[:300]} "
                             f"({ago(_t(p['at']), at)} ago)"))
    if d["cancel"]:
        row("cancel", f"requested by {d['cancel']['by']}: {d['cancel']['reason']}")
    if d["error_code"]:
        row("last error", Text(f"{d['error_code']}: {d['error_message']}", style="red"))
    row("recoveries", d["recoveries"] or None)
    if d["parent_run_id"]:
        row("forked from", f"{d['parent_run_id']} at lap {d['forked_from_lap']}")
    if d["checkpoint"] and d["checkpoint"]["next_action"]:
        row("next action", d["checkpoint"]["next_action"])
    if d["checkpoint"] and d["checkpoint"]["facts"]:
        # Text, not markup: facts and labels are untrusted ("[bold]" stays literal).
        row("facts", Text(json.dumps(d["checkpoint"]["facts"], sort_keys=True)[:500]))
    if d.get("labels"):
        row("labels", Text(", ".join(f"{k}={v}" for k, v in d["labels"].items())))
    if d["finished"]:
        row("result", json.dumps(d["result"])[:500])
    return Panel(grid, title=f"run {escape(d['id'])}", title_align="left", expand=False)


def lap_line(lap: dict[str, Any]) -> RenderableType:
    """One committed lap: model output, then each tool call with its timing."""
    head = Text.from_markup(f"[bold]lap {lap['lap']}[/] "
                            f"[dim]{lap['duration_ms']} ms, attempt {lap['attempt']}[/]")
    lines: list[RenderableType] = [head]
    model = lap["model"]
    if model is not None:
        replay = " [yellow](replayed from journal)[/]" if model["replayed"] else ""
        usage = model.get("usage") or {}
        lines.append(Text.from_markup(
            f"  model{replay}: {escape(model['text'] or '(no text)')} "
            f"[dim]{usage.get('input_tokens', 0)}→{usage.get('output_tokens', 0)} tok[/]"))
    for t in lap["tools"]:
        effect = t["effect"]
        status = f"{effect['kind']} {effect['status']}" if effect else "no ledger entry"
        mark = "[red]✗[/]" if t["error"] else "[green]✓[/]"
        lines.append(Text.from_markup(
            f"  {mark} {escape(t['name'] or '?')} [dim]({status}, {t['ms']} ms)[/] "
            f"→ {escape(t['result'])}"))
    if lap["paused"]:
        lines.append(Text.from_markup(f"  [yellow]paused: {lap['paused']}[/]"))
    return Group(*lines)


def approvals_table(rows: Sequence[dict[str, Any]], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("APPROVAL", "RUN", "TOOL", "ARGUMENTS", "OWNER", "STATUS", "AGE", "TIMEOUT"):
        table.add_column(col)
    for a in rows:
        timeout = _t(a["timeout_at"])
        table.add_row(a["id"], escape(a["run_id"]), escape(a["tool"]),
                      escape(json.dumps(a["arguments"])[:60]), escape(a["owner"] or "-"),
                      a["status"], span(a["age_seconds"]),
                      f"in {span(timeout - at)}" if timeout and a["status"] == "pending"
                      else "-")
    return table


def effects_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("KEY", "TOOL", "KIND", "STATUS", "ATTEMPTS", "ERROR"):
        table.add_column(col)
    for e in rows:
        style = "red" if e["status"] == "unknown" else ""
        table.add_row(escape(e["key"]), escape(e["tool"]), e["kind"],
                      f"[{style}]{e['status']}[/]" if style else e["status"],
                      str(e["attempts"]), escape((e["error"] or "")[:60]))
    return table


__all__ = ["approvals_table", "bar", "batch_header", "effects_table", "lap_line", "run_panel",
           "runs_table"]
