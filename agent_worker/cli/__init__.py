"""``agent-worker``: the operator's command line.

Every command prints for humans by default and one JSON document with
``--json`` (``runs list --watch`` and ``runs tail`` print JSON Lines). Errors
are one line on stderr, ``error: <code>: <message>`` (a JSON object with
``--json``), never a traceback; exit codes are listed in
``agent_worker.cli.common``. Settings come from the ``AGENT_WORKER_*``
environment, like every other process of the fleet.

Starting is cheap: the command modules import the API, the store (SQLAlchemy),
Celery and the settings inside the commands that use them, so ``--help`` and
``--version`` print in a fraction of a second (``python -m bench.cli_startup``
measures it; tests/unit/test_cli_startup.py checks that they load none of it).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from agent_worker.cli import actions, audit, budget, ops, runs, schedules, share, state
from agent_worker.cli.common import FAILED, INTERRUPTED, classify, report
from agent_worker.console import command as console_command

app = typer.Typer(
    name="agent-worker", no_args_is_help=True, add_completion=False,
    pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Run and operate durable AI-agent runs on a Celery fleet.")


def version() -> str:
    """The installed distribution's version (``unknown`` from a checkout that
    was never installed)."""
    from importlib import metadata  # lazy: ~30 ms that only --version needs

    try:
        return metadata.version("agent-worker")
    except metadata.PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"agent-worker {version()}\n")
        raise typer.Exit()


@app.callback()
def _start(
    ctx: typer.Context,
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the installed version and exit.")] = False,
) -> None:
    """Runs before any command (not for the top-level --help or --version)."""
    # lazy: the settings (pydantic-settings) and the store package (SQLAlchemy)
    # load only when a command runs
    from agent_worker.core.principal import default_principal
    from agent_worker.core.settings import get_settings
    from agent_worker.store import tenancy

    # Every statement of the command, the few aggregates that read the store
    # directly included, is narrowed to the principal's tenant (row-level
    # security) until the command ends; building the principal touches no database.
    ctx.with_resource(tenancy.scope(default_principal(get_settings()).tenant))


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
app.add_typer(budget.app, name="budget")
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


def _cwd_importable() -> None:
    """Put the working directory first on ``sys.path``, as ``python -m`` and
    ``celery -A`` do. The console script's ``sys.path[0]`` is the folder the
    script is installed in (``.venv/bin``), so without this an application's
    own modules (``AGENT_WORKER_AGENT_MODULES=myagents``: its ``myagents.py``)
    would not import from the folder ``agent-worker`` runs in."""
    if sys.flags.safe_path:  # python -P / PYTHONSAFEPATH: asked for no such entry
        return
    cwd = os.getcwd()
    if not sys.path or os.path.abspath(sys.path[0] or os.curdir) != cwd:
        sys.path.insert(0, cwd)


def _is_abort(e: BaseException) -> bool:
    """Plain click's ``Abort`` (a library's prompt), known by name: typer uses
    a click of its own, and plain click is not imported to ask."""
    return any(c.__name__ == "Abort" and c.__module__.startswith("click")
               for c in type(e).__mro__)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns (and exits with) the exit code."""
    if argv is None:  # the console script or ``python -m agent_worker.cli``
        _cwd_importable()
    command = typer.main.get_command(app)
    # Known before parsing: a usage error must be JSON too when --json was asked for.
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args=argv, prog_name="agent-worker", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (typer.Abort, KeyboardInterrupt):
        code = report(INTERRUPTED, "interrupted", "interrupted", as_json=as_json)
    except Exception as e:
        code = (report(INTERRUPTED, "interrupted", "interrupted", as_json=as_json)
                if _is_abort(e) else report(*classify(e), as_json=as_json))
    except SystemExit as e:  # pragma: no cover - a library called sys.exit
        code = e.code if isinstance(e.code, int) else FAILED
    if argv is None:
        sys.exit(code)
    return code


__all__ = ["app", "main", "version"]
