"""Commands that change runs: submit, decide approvals, signal, cancel, retry,
resolve unknown effects, fork. Each is one call of the public API, which
commits to Postgres before it hands a lap to the broker."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from agent_worker.cli import render, views
from agent_worker.cli.common import (
    BAD_INPUT,
    FAILED,
    JsonOpt,
    client,
    console,
    emit_json,
    fail,
    now,
    one_of,
    parse_json_arg,
    report,
    styled_status,
)
from agent_worker.core.vocabulary import EFFECT_STATUSES

if TYPE_CHECKING:  # annotations only: the store package loads SQLAlchemy
    from agent_worker.store.base import RunRecord

approvals_app = typer.Typer(help="The approval inbox.", no_args_is_help=True)
effects_app = typer.Typer(help="The side-effect ledger.", no_args_is_help=True)

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id.")]
APPROVAL_STATUSES = ("pending", "approved", "rejected", "timed_out", "cancelled")
WaitTimeout = Annotated[float | None, typer.Option(help="With --wait: give up after this many "
                                                        "seconds (exit 1).")]


def _summary(run: RunRecord, **extra: Any) -> dict[str, Any]:
    aw = client()
    return {**views.run_summary(run, None, now(), aw.rt.settings.stale_after_seconds), **extra}


def _print_run(run: RunRecord, verb: str) -> None:
    line = f"{verb} run [bold]{escape(run.id)}[/] ({escape(run.agent_name)}@" \
           f"{escape(run.agent_version)}): {styled_status(run.status)}, lap {run.lap}"
    console.print(line)


def _finish(run: RunRecord, json_out: bool, *, expect: str = "succeeded") -> None:
    """Print a finished run; a run that ended otherwise than ``expect`` exits 1."""
    if json_out:
        emit_json(_summary(run, result=run.result))
    else:
        _print_run(run, "finished")
        if run.result is not None:
            # JSON, not a Python repr: what a script or a person pastes elsewhere.
            console.print(escape(json.dumps(run.result, ensure_ascii=False))[:2000],
                          soft_wrap=True)
    if run.status != expect:
        why = f"{run.error_code}: {run.error_message}" if run.error_code else run.status
        raise typer.Exit(report(FAILED, run.error_code or f"run_{run.status}",
                                f"run {run.id} {run.status}: {why}", as_json=json_out))


def submit(
    agent: Annotated[str, typer.Argument(help="Registered agent name.")],
    input: Annotated[str | None, typer.Option(
        "--input", "-i", help="Run input: JSON, @file.json, or - for stdin.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Choose the run id (a retried submit "
                                                    "with the same id and input starts "
                                                    "nothing; another input is refused, "
                                                    "exit 2 run_conflict).")]
    = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant the run belongs to.")] = None,
    version: Annotated[str | None, typer.Option(help="Agent version (default: newest).")]
    = None,
    wait: Annotated[bool, typer.Option(help="Wait for the run to finish; exit 1 unless it "
                                            "succeeded.")] = False,
    timeout: WaitTimeout = None,
    priority: Annotated[int, typer.Option(help="Order among the tenant's runs waiting for "
                                               "a slot (-1000..1000; higher first).")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Start a run of AGENT."""
    aw = client()
    run = aw.start_run(agent, parse_json_arg(input, "--input"), run_id=run_id, tenant=tenant,
                       version=version, priority=priority)
    if wait:
        _finish(aw.wait(run.id, timeout), json_out)
    elif json_out:
        emit_json(_summary(run))
    else:
        _print_run(run, "started")


def _decide(approve: bool, ident: str, comment: str | None, json_out: bool,
            arguments: str | None = None) -> None:
    aw = client()
    if arguments is not None:
        record = aw.approve(ident, comment=comment,
                            arguments=parse_json_arg(arguments, "arguments"))
    else:
        record = (aw.approve if approve else aw.reject)(ident, comment=comment)
    run = aw.get_run(record.run_id)
    if json_out:
        emit_json({**views.approval_view(record, now()), "run_status": run.status})
    else:
        console.print(f"{record.status} {escape(record.tool_name)} "
                      f"(approval {record.id}) for run {escape(run.id)}; run is "
                      f"{styled_status(run.status)}")


IdentArg = Annotated[str, typer.Argument(metavar="APPROVAL_OR_RUN",
                                         help="Approval id, or a run with one pending.")]
CommentOpt = Annotated[str | None, typer.Option(help="Why (the model sees it on reject).")]


def approve(ident: IdentArg, comment: CommentOpt = None,
            arguments: Annotated[str | None, typer.Option(
                help="Run the call with these arguments instead (JSON, @file or -); "
                     "checked against the tool's schema.")] = None,
            json_out: JsonOpt = False) -> None:
    """Approve a pending call; the run resumes and makes it."""
    _decide(True, ident, comment, json_out, arguments)


def reject(ident: IdentArg, comment: CommentOpt = None, json_out: JsonOpt = False) -> None:
    """Reject a pending call; the model is told who rejected it and why."""
    _decide(False, ident, comment, json_out)


def cancel(
    run_id: RunArg,
    reason: Annotated[str, typer.Option(help="Why (recorded on the run).")],
    wait: Annotated[bool, typer.Option(help="Wait until compensations ran and the run is "
                                            "cancelled.")] = False,
    timeout: WaitTimeout = None,
    json_out: JsonOpt = False,
) -> None:
    """Cancel a run at its next lap boundary; compensatable effects are undone."""
    aw = client()
    run = aw.cancel(run_id, reason=reason)
    if wait:
        _finish(aw.wait(run.id, timeout), json_out, expect="cancelled")
    elif json_out:
        emit_json(_summary(run))
    else:
        _print_run(run, "cancelling")


def retry(run_id: RunArg, json_out: JsonOpt = False) -> None:
    """Resume a failed (or attention-needing) run from its last checkpoint."""
    run = client().retry(run_id)
    if json_out:
        emit_json(_summary(run))
    else:
        _print_run(run, "retrying")


def signal(
    run_id: RunArg,
    name: Annotated[str, typer.Argument(help="Signal name the run waits (or will wait) for.")],
    payload: Annotated[str | None, typer.Option(help="JSON, @file.json or -.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Send a signal; a run waiting for NAME resumes, one that waits later finds it."""
    aw = client()
    record = aw.send_signal(run_id, name, parse_json_arg(payload, "--payload"))
    run = aw.get_run(run_id)
    if json_out:
        emit_json({"id": record.id, "run_id": record.run_id, "name": record.name,
                   "payload": record.payload, "created_at": record.created_at,
                   "run_status": run.status})
    else:
        console.print(f"signal {escape(name)} stored for run {escape(run_id)}; run is "
                      f"{styled_status(run.status)}")


def fork(
    run_id: RunArg,
    lap: Annotated[int, typer.Option(min=0, help="Start from the state after this lap.")],
    new_run_id: Annotated[str | None, typer.Option("--run-id", help="Id of the new run.")]
    = None,
    version: Annotated[str | None, typer.Option(help="Agent version for the fork.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Start a new run from RUN's state after --lap; the original is untouched."""
    run = client().fork(run_id, lap, new_run_id=new_run_id, version=version)
    if json_out:
        emit_json(_summary(run))
    else:
        _print_run(run, f"forked {escape(run_id)}@{lap} as")


@approvals_app.command("list")
def approvals_list(
    status: Annotated[str, typer.Option(callback=one_of(APPROVAL_STATUSES),
                                        help=", ".join(APPROVAL_STATUSES) + ".")] = "pending",
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Approvals in a status, oldest first (the inbox)."""
    at = now()
    rows = [views.approval_view(a, at)
            for a in client().list_approvals(status=status, run_id=run_id)]
    if json_out:
        emit_json(rows)
    elif rows:
        console.print(render.approvals_table(rows, at))
    else:
        console.print(f"[dim]no {escape(status)} approvals[/]")


@effects_app.command("list")
def effects_list(
    run_id: RunArg,
    status: Annotated[str | None, typer.Option(
        callback=one_of(EFFECT_STATUSES),
        help="Only effects in this status: " + ", ".join(EFFECT_STATUSES) + ".")]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """A run's ledger: every side-effecting call, its key and status."""
    aw = client()
    aw.get_run(run_id)
    rows = [views.effect_view(e) for e in aw.effects(run_id)
            if status is None or e.status == status]
    if json_out:
        emit_json(rows)
    else:
        console.print(render.effects_table(rows))


@effects_app.command("resolve")
def effects_resolve(
    key: Annotated[str, typer.Argument(help="The effect's idempotency key (run:lap:call).")],
    applied: Annotated[bool | None, typer.Option(
        "--applied/--not-applied",
        help="What you found out: it landed (reuse --result), or it did not (call again).",
        show_default=False)] = None,
    result: Annotated[str | None, typer.Option(help="With --applied: the call's result as "
                                                    "JSON (what the model will see).")]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """Settle an effect whose outcome was unknown; the paused run resumes."""
    if applied is None:
        fail(BAD_INPUT, "invalid_input", "say --applied or --not-applied")
    aw = client()
    record = aw.resolve_effect(key, applied=applied, result=parse_json_arg(result, "--result"))
    current = next((e for e in aw.effects(record.run_id) if e.key == key), None)
    run = aw.get_run(record.run_id)
    out = {"key": key, "run_id": record.run_id, "resolved": "applied" if applied
           else "not_applied", "by": aw.principal.id,
           "effect": None if current is None else views.effect_view(current),
           "run_status": run.status}
    if json_out:
        emit_json(out)
    else:
        console.print(f"effect {escape(key)} resolved as {out['resolved']}; run "
                      f"{escape(run.id)} is {styled_status(run.status)}")


__all__ = ["approvals_app", "approve", "cancel", "effects_app", "fork", "reject", "retry",
           "signal", "submit"]
