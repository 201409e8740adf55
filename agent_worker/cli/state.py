"""``agent-worker runs state`` and ``runs update-state``: read a
run's latest committed plan, facts, next action, budget and pending calls in
one query, and hand an operator's edit to the run's next lap."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from agent_worker.cli.common import JsonOpt, client, console, emit_json, parse_json_arg
from agent_worker.core.errors import InvalidInputError

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id.")]


def show_state(run_id: RunArg, json_out: JsonOpt = False) -> None:
    """The run's latest committed state (plan, next action, facts, budget,
    pending calls), whatever it is doing; one query, the run untouched."""
    view = client().get_state(run_id)
    if json_out:
        emit_json(view.model_dump(mode="json"))
        return
    console.print(f"[bold]{escape(view.run_id)}[/] {view.status} after lap {view.lap}"
                  + (f", waiting for {escape(view.waiting_for)}" if view.waiting_for else ""))
    for i, item in enumerate(view.plan, 1):
        # "[x]" escaped: as markup it is a tag, which rich drops.
        console.print(f"  {i}. \\[{'x' if item.done else ' '}] {escape(item.title)}")
    if view.next_action:
        console.print(f"  next: {escape(view.next_action)}")
    for key, value in view.facts.items():
        console.print(f"  fact {escape(key)} = {escape(str(value))}")
    for pc in view.pending_calls:
        console.print(f"  pending call {escape(pc.call.name)} (lap {pc.lap}, #{pc.index})")
    if view.pending_edits:
        console.print(f"  {view.pending_edits} operator edit(s) wait for the next lap")


def update_state(
    run_id: RunArg,
    fact: Annotated[list[str] | None, typer.Option(
        help="KEY=JSON to pin (repeatable); KEY=null unpins.")] = None,
    plan: Annotated[list[str] | None, typer.Option(
        help="A plan step (repeatable, in order); replaces the plan.")] = None,
    note: Annotated[str | None, typer.Option(
        help="Shown to the model as a message from the operator.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Edit a run's facts or plan, or leave it a note: applied by the run's next
    lap commit (never under a running lap), recorded in its events."""
    facts: dict[str, Any] | None = None
    if fact:
        facts = {}
        for item in fact:
            key, sep, raw = item.partition("=")
            if not sep:
                raise InvalidInputError(f"--fact {item!r} must be KEY=JSON")
            facts[key] = parse_json_arg(raw, f"fact {key}")
    edit = client().update_state(run_id, facts=facts, plan=plan, note=note)
    if json_out:
        emit_json({"edit": edit.id, "run_id": edit.run_id, "requested_by": edit.requested_by,
                   "fields": sorted(edit.edit), "applied_lap": edit.applied_lap})
    else:
        console.print(f"edit {edit.id} for run {escape(run_id)}: applied at its next lap")


__all__ = ["show_state", "update_state"]
