"""``agent-worker schedules``: create, list, show, pause, resume, delete and
trigger durable schedules. Each command is one call of the public API
(``AgentWorker``'s schedule verbs); errors map to exit codes like every other
command's (an unknown schedule exits 3, a bad cron or time zone exits 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from agent_worker.cli.common import (
    JsonOpt,
    client,
    console,
    emit_json,
    jsonable,
    one_of,
    parse_json_arg,
)
from agent_worker.core.vocabulary import CATCH_UPS, OVERLAPS

if TYPE_CHECKING:  # annotations only: the store package loads SQLAlchemy
    from agent_worker.store.schedtypes import ScheduleRecord

app = typer.Typer(help="Durable cron schedules that start runs.", no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="Schedule name.")]


def _view(s: ScheduleRecord) -> dict[str, Any]:
    value: dict[str, Any] = jsonable(s)
    return value


def _line(s: ScheduleRecord) -> str:
    state = "[yellow]paused[/]" if s.paused else "[green]active[/]"
    return (f"schedule [bold]{escape(s.name)}[/] ({escape(s.agent_name)}, "
            f"{escape(s.cron)} {escape(s.timezone)}): {state}, next "
            f"{s.next_fire_at.isoformat()}")


def _print(s: ScheduleRecord, json_out: bool) -> None:
    if json_out:
        emit_json(_view(s))
    else:
        console.print(_line(s))


@app.command("create")
def create(
    name: NameArg,
    agent: Annotated[str, typer.Argument(help="Registered agent name.")],
    cron: Annotated[str, typer.Option(help="Cron expression: 5 fields, or 6 with seconds "
                                           "last.")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--tz", help="IANA time zone the cron fields are "
                                                       "read in.")] = "UTC",
    input: Annotated[str | None, typer.Option(
        "--input", "-i", help="Run input: JSON, @file.json, or - for stdin.")] = None,
    catchup: Annotated[str, typer.Option(callback=one_of(CATCH_UPS),
                                         help="Missed fire times after beat downtime: "
                                              + ", ".join(CATCH_UPS) + ".")] = "skip",
    catchup_limit: Annotated[int, typer.Option(help="With --catchup all: at most this many "
                                                    "missed fire times.")] = 10,
    overlap: Annotated[str, typer.Option(callback=one_of(OVERLAPS),
                                         help="While the previous run goes on: "
                                              + ", ".join(OVERLAPS) + ".")] = "skip",
    tenant: Annotated[str | None, typer.Option(help="Tenant its runs belong to.")] = None,
    version: Annotated[str | None, typer.Option(help="Agent version (default: newest at "
                                                     "each firing).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a schedule that starts a run of AGENT at each fire time."""
    s = client().schedule(name, agent, cron, parse_json_arg(input, "--input"),
                          timezone=timezone, catchup=catchup, catchup_limit=catchup_limit,
                          overlap=overlap, tenant=tenant, version=version)
    _print(s, json_out)


@app.command("list")
def list_(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Schedules by name, with their next fire time."""
    rows = client().list_schedules(tenant=tenant)
    if json_out:
        emit_json([_view(s) for s in rows])
        return
    if not rows:
        console.print("[dim]no schedules[/]")
        return
    table = Table("name", "agent", "cron", "tz", "catchup", "overlap", "state", "next fire",
                  "last run")
    for s in rows:
        table.add_row(escape(s.name), escape(s.agent_name), escape(s.cron), escape(s.timezone),
                      s.catchup, s.overlap, "paused" if s.paused else "active",
                      s.next_fire_at.isoformat(), escape(s.last_run_id or "-"))
    console.print(table)


@app.command("show")
def show(name: NameArg, json_out: JsonOpt = False) -> None:
    """One schedule in full."""
    _print(client().get_schedule(name), json_out)


@app.command("pause")
def pause(name: NameArg, json_out: JsonOpt = False) -> None:
    """Stop firing NAME (runs it started go on)."""
    _print(client().pause_schedule(name), json_out)


@app.command("resume")
def resume(name: NameArg, json_out: JsonOpt = False) -> None:
    """Fire NAME again from its next fire time (times passed while paused are not owed)."""
    _print(client().resume_schedule(name), json_out)


@app.command("delete")
def delete(name: NameArg, json_out: JsonOpt = False) -> None:
    """Delete NAME; runs it started are untouched."""
    client().delete_schedule(name)
    if json_out:
        emit_json({"deleted": name})
    else:
        console.print(f"deleted schedule [bold]{escape(name)}[/]")


@app.command("trigger")
def trigger(name: NameArg, json_out: JsonOpt = False) -> None:
    """Fire NAME now, under its overlap policy."""
    run = client().trigger_schedule(name)
    if json_out:
        emit_json({"schedule": name, "run_id": None if run is None else run.id,
                   "skipped": run is None})
    elif run is None:
        console.print(f"skipped: the previous run of {escape(name)} is still going "
                      "(overlap skip)")
    else:
        console.print(f"started run [bold]{escape(run.id)}[/]")


__all__ = ["app"]
