"""``agent-worker``: the operator's command line.

Every command prints for humans by default and one JSON document with
``--json`` (``runs list --watch`` and ``runs tail`` print JSON Lines). Errors
are one line on stderr, ``error: <code>: <message>`` (a JSON object with
``--json``), never a traceback; exit codes are listed in
``agent_worker.cli.common``. Settings come from the ``AGENT_WORKER_*``
environment, like every other process of the fleet.
"""

from __future__ import annotations

import sys

import click
import typer

from agent_worker.cli import actions, audit, ops, runs, schedules, share, state
from agent_worker.cli.common import FAILED, INTERRUPTED, classify, report
from agent_worker.console import command as console_command
from agent_worker.principal import default_principal
from agent_worker.settings import get_settings
from store import tenancy

app = typer.Typer(
    name="agent-worker", no_args_is_help=True, add_completion=False,
    pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Run and operate durable AI-agent runs on a Celery fleet.")

app.command("submit")(actions.submit)
app.add_typer(runs.app, name="runs")
runs.app.command("state")(state.show_state)
runs.app.command("update-state")(state.update_state)
app.command("approve")(actions.approve)
app.command("reject")(actions.reject)
app.command("cancel")(actions.cancel)
app.command("retry")(actions.retry)
app.command("signal")(actions.signal)
app.command("fork")(actions.fork)
app.add_typer(actions.approvals_app, name="approvals")
app.add_typer(actions.effects_app, name="effects")
app.command("audit")(audit.audit)
app.add_typer(ops.db_app, name="db")
app.add_typer(schedules.app, name="schedules")
app.command("worker", context_settings=ops.PASS_THROUGH)(ops.worker)
app.command("beat", context_settings=ops.PASS_THROUGH)(ops.beat)
app.command("metrics")(ops.metrics)
app.command("demo")(ops.demo)
app.command("queues")(share.queues)
app.add_typer(share.share_app, name="share")
app.add_typer(console_command.app, name="console")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns (and exits with) the exit code."""
    command = typer.main.get_command(app)
    # Known before parsing: a usage error must be JSON too when --json was asked for.
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        # Every statement of the command, the few aggregates that read the store
        # directly included, is narrowed to the principal's tenant (row-level
        # security); building the principal touches no database.
        with tenancy.scope(default_principal(get_settings()).tenant):
            result = command.main(args=argv, prog_name="agent-worker", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        code = report(INTERRUPTED, "interrupted", "interrupted", as_json=as_json)
    except Exception as e:
        code = report(*classify(e), as_json=as_json)
    except SystemExit as e:  # pragma: no cover - a library called sys.exit
        code = e.code if isinstance(e.code, int) else FAILED
    if argv is None:
        sys.exit(code)
    return code


__all__ = ["app", "main"]
