"""``agent-worker runs follow RUN [--after ID]``: the live stream of a run
(``AgentWorker.stream``), one line per event as it commits, tool calls and
results included; exits when the run ends (1 unless it succeeded). Resume a
dropped session with ``--after`` and the last id printed: nothing is shown
twice, nothing skipped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from agent_worker.cli.common import FAILED, JsonOpt, client, console, emit_json, report

if TYPE_CHECKING:  # annotations only: streaming loads the runtime and the store
    from agent_worker.streaming import StreamEvent


def follow(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    after: Annotated[str, typer.Option(help="Resume after this event id (the last one "
                                            "printed); 0 replays from the start.")] = "0",
    json_out: JsonOpt = False,
) -> None:
    """Stream a run's events as they commit (lap commits with tool calls and results,
    pauses, signals, decisions) until it ends; resumable with --after."""
    from agent_worker.streaming import check_after  # lazy: see the TYPE_CHECKING import

    last: StreamEvent | None = None
    for event in client().stream(run_id, after=check_after(after)):
        last = event
        if json_out:
            emit_json(event.to_json())
        else:
            _print(event)
    if last is None or last.data is None:
        return
    status = str(last.data.get("status"))
    if status != "succeeded":
        code = str(last.data.get("error_code") or f"run_{status}")
        raise typer.Exit(report(FAILED, code, f"run {run_id} {status}: "
                                f"{last.data.get('error_message') or status}",
                                as_json=json_out))


def _print(event: StreamEvent) -> None:
    where = f" lap {event.lap}" if event.lap is not None else ""
    at = f"{event.created_at:%H:%M:%S} " if event.created_at else ""
    data = ", ".join(f"{k}={v}" for k, v in (event.data or {}).items()
                     if v is not None and k != "trace")
    console.print(f"[dim]{event.id:>8} {at}[/][cyan]{escape(event.kind)}[/]{where}"
                  + (f": {escape(data[:300])}" if data else ""))
    for m in event.messages:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        text = (m.content or "")[:200]
        console.print(f"         [dim]{m.role}[/] {escape(text)}"
                      + (f" [yellow]→ {escape(calls[:300])}[/]" if calls else ""))


__all__ = ["follow"]
