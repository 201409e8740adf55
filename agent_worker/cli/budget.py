"""``agent-worker budget raise``: lift a paused run's limits and resume it.

A run whose agent pauses on its budget (``on_exceed="pause"``) waits for an
operator; this is the API's ``raise_budget`` (the ``raise_budget`` action,
audited by the API like every operator verb), so the CLI and the console
raise budgets the same way."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.markup import escape

from agent_worker.cli import views
from agent_worker.cli.common import JsonOpt, client, console, emit_json, now, styled_status

app = typer.Typer(help="A run's budget.", no_args_is_help=True)


@app.command("raise")
def raise_budget(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (it must be waiting).")],
    max_laps: Annotated[int | None, typer.Option(min=0, help="New lap limit.")] = None,
    max_input_tokens: Annotated[int | None, typer.Option(
        min=0, help="New limit of input tokens.")] = None,
    max_output_tokens: Annotated[int | None, typer.Option(
        min=0, help="New limit of output tokens.")] = None,
    max_cost: Annotated[str | None, typer.Option(
        help="New cost limit, in the agents' price-table currency (e.g. 2.50).")] = None,
    max_wall_seconds: Annotated[float | None, typer.Option(
        min=0, help="New wall-clock limit since the run started, in seconds.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Raise a paused run's limits (only those given change) and resume it."""
    limits: dict[str, Any] = {k: v for k, v in {
        "max_laps": max_laps, "max_input_tokens": max_input_tokens,
        "max_output_tokens": max_output_tokens, "max_wall_seconds": max_wall_seconds,
    }.items() if v is not None}
    if max_cost is not None:
        limits["max_cost"] = max_cost  # validated as a Decimal by the API's Budget
    if not limits:
        raise typer.BadParameter("give at least one new limit (e.g. --max-laps 400)")
    aw = client()
    run = aw.raise_budget(run_id, **limits)
    if json_out:
        emit_json({**views.run_summary(run, None, now(), aw.rt.settings.stale_after_seconds),
                   "limits": run.limits})
        return
    shown = ", ".join(f"{k}={Decimal(str(v)) if k == 'max_cost' else v}"
                      for k, v in sorted(limits.items()))
    console.print(f"budget of run {escape(run.id)} raised ({escape(shown)}); run is "
                  f"{styled_status(run.status)}")


__all__ = ["app", "raise_budget"]
