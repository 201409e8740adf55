"""``agent-worker runs``: list (and watch) runs, show one, tail its laps.

Long batches: ``runs list --watch`` redraws every ``--interval`` seconds with
each run's lap and plan progress and a batch total; ``--until-done`` returns
once every listed run has finished. With ``--json``, ``--watch`` and ``tail``
print one JSON document per line (JSON Lines), one per frame or event.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape

from agent_worker.cli import render, views
from agent_worker.cli.common import (
    FAILED,
    JsonOpt,
    client,
    console,
    emit_json,
    fail,
    now,
    one_of,
    report,
    sql_store,
    styled_status,
)
from agent_worker.cli.follow import follow
from agent_worker.cli.tree import render_tree, run_tree
from agent_worker.core.vocabulary import RUN_STATUSES, TERMINAL

app = typer.Typer(help="List, inspect and follow runs.", no_args_is_help=True)
app.command("follow")(follow)


def _stale_after() -> float:
    return float(client().rt.settings.stale_after_seconds)


def _checkpoints(run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each run's latest checkpointed state (one query)."""
    # lazy: the store package loads SQLAlchemy, which --help must not pay for
    from agent_worker.store import stats

    return stats.latest_checkpoints(sql_store(), run_ids)


def list_rows(*, status: str | None, agent: str | None, agent_version: str | None,
              tenant: str | None, stale: bool, limit: int, parent: str | None = None
              ) -> list[dict[str, Any]]:
    """The runs matching the filters, newest first, with plan progress."""
    aw = client()
    found = aw.list_runs(status=status, agent=agent, agent_version=agent_version,
                         tenant=tenant, stale=stale, limit=limit, parent=parent)
    states = _checkpoints([r.id for r in found])
    at, stale_after = now(), _stale_after()
    return [views.run_summary(r, states.get(r.id), at, stale_after) for r in found]


@app.command("list")
def list_runs(
    status: Annotated[str | None, typer.Option(
        callback=one_of(RUN_STATUSES),
        help="Only runs in this status: " + ", ".join(RUN_STATUSES) + ".")] = None,
    agent: Annotated[str | None, typer.Option(help="Only runs of this agent.")] = None,
    agent_version: Annotated[str | None, typer.Option(help="Only runs started on this "
                                                           "agent version.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's runs.")] = None,
    parent: Annotated[str | None, typer.Option(help="Only the child runs (and forks) of this "
                                                    "run (with --watch: a fan-out's "
                                                    "progress).")] = None,
    stale: Annotated[bool, typer.Option(help="Only queued/running runs with no checkpoint for "
                                             "AGENT_WORKER_STALE_AFTER_SECONDS.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 100,
    watch: Annotated[bool, typer.Option(help="Redraw until interrupted (a progress "
                                             "view for batches).")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between redraws.")] = 2.0,
    until_done: Annotated[bool, typer.Option(help="With --watch: stop once every listed run "
                                                  "has finished.")] = False,
    count: Annotated[int | None, typer.Option(min=1, help="With --watch: stop after this "
                                                          "many frames.")] = None,
    label: Annotated[list[str] | None, typer.Option(
        help="Only runs with this label, KEY=VALUE (repeatable: all must match). With "
             "--label, --cursor, --since or --until, --json prints {runs, next_cursor}.")
    ] = None,
    cursor: Annotated[str | None, typer.Option(help="The next page: a next_cursor an "
                                                    "earlier listing printed.")] = None,
    since: Annotated[datetime | None, typer.Option(help="Only runs created at or after "
                                                        "this time (UTC if no zone).")] = None,
    until: Annotated[datetime | None, typer.Option(help="Only runs created before this "
                                                        "time (UTC if no zone).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Runs, newest first: status, lap, plan progress, time since the last checkpoint."""
    if label or cursor or since or until:
        _search(status=status, agent=agent, agent_version=agent_version, tenant=tenant,
                labels=label or [], cursor=cursor, since=since, until=until, limit=limit,
                json_out=json_out)
        return
    filters: dict[str, Any] = dict(status=status, agent=agent, agent_version=agent_version,
                                   tenant=tenant, stale=stale, limit=limit, parent=parent)
    if not watch:
        rows = list_rows(**filters)
        if json_out:
            emit_json(rows)
        elif rows:
            console.print(render.runs_table(rows, now()))
        else:
            console.print("[dim]no runs match[/]")
        return
    _watch(filters, interval=interval, until_done=until_done, count=count, json_out=json_out)


def _search(*, labels: list[str], cursor: str | None, since: datetime | None,
            until: datetime | None, limit: int, json_out: bool, **filters: Any) -> None:
    """``runs list`` by labels and time, one page (``AgentWorker.search_runs``)."""
    from agent_worker.steering import parse_labels  # lazy: it loads the store (SQLAlchemy)

    page = client().search_runs(labels=parse_labels(labels), cursor=cursor,
                                created_after=_utc(since), created_before=_utc(until),
                                limit=min(limit, 1000), **filters)
    states = _checkpoints([r.id for r in page.runs])
    at, stale_after = now(), _stale_after()
    rows = [{**views.run_summary(r, states.get(r.id), at, stale_after),
             "labels": r.labels or {}} for r in page.runs]
    if json_out:
        emit_json({"runs": rows, "next_cursor": page.next_cursor})
        return
    console.print(render.runs_table(rows, at) if rows else "[dim]no runs match[/]")
    if page.next_cursor:
        console.print(f"[dim]more: --cursor {page.next_cursor}[/]")


def _utc(when: datetime | None) -> datetime | None:
    """Typer parses ISO times without a zone as naive: the CLI means UTC."""
    if when is None or when.tzinfo is not None:
        return when
    return when.replace(tzinfo=UTC)


def _frame(rows: list[dict[str, Any]], at: datetime) -> dict[str, Any]:
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["status"]] = totals.get(r["status"], 0) + 1
    finished = sum(1 for r in rows if r["status"] in TERMINAL)
    return {"at": at, "total": len(rows), "finished": finished, "by_status": totals,
            "runs": rows}


def _watch(filters: dict[str, Any], *, interval: float, until_done: bool, count: int | None,
           json_out: bool) -> None:
    frames = 0
    # A terminal redraws in place; a pipe gets one table per frame.
    live = (Live(console=console, auto_refresh=False, transient=False)
            if console.is_terminal and not json_out else None)
    try:
        if live is not None:
            live.start()
        while True:
            rows = list_rows(**filters)
            at = now()
            frames += 1
            view = Group(render.batch_header(rows), render.runs_table(rows, at))
            if json_out:
                emit_json(_frame(rows, at))
            elif live is not None:
                live.update(view, refresh=True)
            else:
                console.print(view)
                console.print()
            done = bool(rows) and all(r["status"] in TERMINAL for r in rows)
            if (until_done and done) or (count is not None and frames >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        if live is not None:
            live.stop()


@app.command("show")
def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    laps: Annotated[bool, typer.Option("--laps", help="Also print each committed lap: model "
                                                      "output, tool calls, effects, timing.")]
    = False,
    last: Annotated[int | None, typer.Option(min=1, help="With --laps: only the last N "
                                                          "laps.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """One run: status, lap, time since its checkpoint, budget, approvals, last error."""
    from agent_worker.engine import progress  # lazy: the engine loads the store (SQLAlchemy)

    aw = client()
    run = aw.get_run(run_id)
    state = _checkpoints([run.id]).get(run.id)
    at = now()
    detail = views.run_detail(run, state, aw.list_approvals(run_id=run.id), at,
                              _stale_after())
    # What long tools of the lap in flight last reported (ctx.heartbeat).
    detail["progress"] = (progress.latest(aw.events(run.id), run.next_lap)
                          if run.status == "running" else [])
    lap_rows: list[dict[str, Any]] = []
    if laps:
        lap_rows = lap_records(run.id, last=last)
        detail["laps"] = lap_rows
    detail["tree"] = run_tree(aw.rt.store, run.id)
    if json_out:
        emit_json(detail)
        return
    console.print(render.run_panel(detail, at))
    tree = render_tree(run.id, detail["tree"])
    if tree is not None:
        console.print(tree)
    for lap in lap_rows:
        console.print(render.lap_line(lap))


def lap_records(run_id: str, *, last: int | None = None) -> list[dict[str, Any]]:
    aw = client()
    commits = [e for e in aw.events(run_id) if e.kind == "lap_committed"]
    if last is not None:
        commits = commits[-last:]
    book = views.LapBook(run_id)
    book.add_messages(aw.messages(run_id))
    book.add_effects(aw.effects(run_id))
    return [book.lap(e) for e in commits]


@app.command("tail")
def tail(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    last: Annotated[int, typer.Option(min=0, help="Start with the last N events already "
                                                   "recorded.")] = 5,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds "
                                                       "(exit 1).")] = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Poll interval.")] = 0.5,
    json_out: JsonOpt = False,
) -> None:
    """Follow a run's laps as they commit; exit when it finishes (1 unless it succeeded)."""
    aw = client()
    run = aw.get_run(run_id)
    book = views.LapBook(run.id)
    seq = 0
    history = aw.events(run.id)
    after = history[-last - 1].id if 0 < last < len(history) else (
        0 if last else (history[-1].id if history else 0))
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        # Events first: a lap's messages commit with its event, so they are
        # visible to the message read that follows.
        events = aw.events(run.id, after_id=after)
        new_messages = aw.rt.store.list_messages(run.id, start=seq)
        if new_messages:
            book.add_messages(new_messages)
            seq = new_messages[-1].seq + 1
        if any(e.kind == "lap_committed" for e in events):
            book.add_effects(aw.effects(run.id))
        for e in events:
            after = e.id
            _print_event(book, e, json_out)
        run = aw.get_run(run.id)
        if run.status in TERMINAL and not aw.events(run.id, after_id=after):
            break
        if deadline is not None and time.monotonic() > deadline:
            fail(FAILED, "timeout", f"run {run.id} is still {run.status} at lap {run.lap} "
                                    f"after {timeout}s")
        time.sleep(interval)
    summary = views.run_summary(run, None, now(), _stale_after())
    if json_out:
        emit_json({"event": "end", "run": summary})
    else:
        console.print(f"run {escape(run.id)} {styled_status(run.status)} after {run.lap} laps"
                      + (escape(f": {run.error_code}: {run.error_message}")
                         if run.error_code else ""))
    if run.status != "succeeded":
        why = f"{run.error_code}: {run.error_message}" if run.error_code else run.status
        raise typer.Exit(report(FAILED, run.error_code or f"run_{run.status}",
                                f"run {run.id} {run.status}: {why}", as_json=json_out))


def _print_event(book: views.LapBook, e: Any, json_out: bool) -> None:
    if e.kind == "lap_committed":
        lap = book.lap(e)
        if json_out:
            emit_json({"event": "lap_committed", **lap})
        else:
            console.print(render.lap_line(lap))
        return
    if json_out:
        emit_json({"event": e.kind, "lap": e.lap, "at": e.created_at, "data": e.data})
    else:
        data = ", ".join(f"{k}={v}" for k, v in (e.data or {}).items() if v is not None)
        where = f" lap {e.lap}" if e.lap is not None else ""
        console.print(f"[dim]{e.created_at:%H:%M:%S}[/] [cyan]{escape(e.kind)}[/]{where}"
                      + (f": {escape(data[:300])}" if data else ""))


__all__ = ["app", "lap_records", "list_rows"]
