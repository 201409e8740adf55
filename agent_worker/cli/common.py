"""What every command shares: the client, output in two forms, and the one
place that turns an exception into an exit code and a one-line message.

Exit codes (stable, for scripts):

    0  ok
    1  operational failure: a run failed or was cancelled under --wait, a
       timeout, the database or broker unreachable, anything unexpected
    2  bad input: malformed JSON, unknown agent/approval/effect, invalid ids,
       a run id that exists with another agent or input (``run_conflict``)
    3  not found: no such run
    4  invalid state: the run or approval does not allow that now
    5  permission denied: the principal (AGENT_WORKER_PRINCIPAL_*) may not
       do that; the refusal is in the audit log
  130  interrupted

With ``--json`` an error is one JSON object on stderr instead of the text line:
``{"error": {"code": ..., "message": ..., "exit_code": ..., "meaning": ...}}``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from agent_worker.cli.terminal import SafeConsole, strip_terminal
from agent_worker.core.errors import (
    AgentWorkerError,
    InvalidInputError,
    InvalidStateError,
    NotFoundError,
    PermissionDeniedError,
)

OK, FAILED, BAD_INPUT, NOT_FOUND, INVALID_STATE, INTERRUPTED = 0, 1, 2, 3, 4, 130
PERMISSION_DENIED = 5
EXIT_MEANINGS = {OK: "ok", FAILED: "operational failure", BAD_INPUT: "bad input",
                 NOT_FOUND: "not found", INVALID_STATE: "invalid state",
                 PERMISSION_DENIED: "permission denied", INTERRUPTED: "interrupted"}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


# Piped output is for grep and less, not an 80-column terminal: don't wrap tables.
console = SafeConsole(highlight=False,
                      width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200")))


class CliFailure(Exception):
    """Raised by a command to end with ``code`` and one line on stderr."""

    def __init__(self, exit_code: int, code: str, message: str) -> None:
        super().__init__(message)
        self.exit_code, self.code = exit_code, code


def client() -> Any:
    """The default ``AgentWorker`` (store and Celery broker from settings),
    built on first use so ``--help`` never touches the database. It acts as
    the configured principal (``AGENT_WORKER_PRINCIPAL_ID``, ``_TENANT``,
    ``_ROLES``): there is no ``--by``, the audit log says who from that."""
    # lazy: the API drags in the store, SQLAlchemy and Celery (most of a second);
    # --help, --version and a usage error print without them
    from agent_worker.api import client as default_client

    return default_client()


def sql_store() -> Any:
    """The ``SqlStore`` behind the client, for the read-only aggregates."""
    from agent_worker.store.sql import SqlStore  # lazy: like client()'s import

    store = client().rt.store
    if not isinstance(store, SqlStore):
        raise CliFailure(FAILED, "unsupported_store", "this command needs the SQL store")
    return store


# --- values ------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Plain JSON values from records, pydantic models, datetimes and decimals."""
    from pydantic import BaseModel  # lazy: only output (after the API loaded it) needs it

    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(mode="json"))
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def emit_json(value: Any) -> None:
    """One JSON document on its own line (scripts may read line by line)."""
    sys.stdout.write(json.dumps(jsonable(value), sort_keys=False) + "\n")
    sys.stdout.flush()


def parse_json_arg(raw: str | None, what: str) -> Any:
    """A JSON value given inline, as ``@file.json``, or ``-`` for stdin."""
    if raw is None:
        return None
    try:
        if raw == "-":
            text = sys.stdin.read()
        elif raw.startswith("@"):
            text = Path(raw[1:]).read_text()
        else:
            text = raw
    except OSError as e:
        raise CliFailure(BAD_INPUT, "invalid_input", f"cannot read {what}: {e}") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise CliFailure(BAD_INPUT, "invalid_input", f"{what} is not valid JSON: {e}") from e
    except RecursionError as e:  # the parser's own limit, far past max_json_depth
        raise CliFailure(BAD_INPUT, "nesting_too_deep", f"{what} nests too deeply") from e


def now() -> datetime:
    return datetime.now(UTC)


def ago(when: datetime | None, at: datetime | None = None) -> str:
    """``12s``, ``4m``, ``3h``, ``2d`` (empty for ``None``)."""
    if when is None:
        return ""
    return span((at or now()) - when)


def span(delta: Any) -> str:
    seconds = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.0f}s"
    if s < 3600:
        return f"{sign}{s / 60:.0f}m"
    if s < 86400:
        return f"{sign}{s / 3600:.1f}h"
    return f"{sign}{s / 86400:.1f}d"


STATUS_STYLE = {"queued": "cyan", "running": "bold blue", "waiting": "yellow",
                "sleeping": "magenta", "succeeded": "green", "failed": "bold red",
                "cancelled": "dim"}


def styled_status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, '')}]{status}[/]"


# --- errors --------------------------------------------------------------------------


def classify(e: BaseException) -> tuple[int, str, str]:
    """(exit code, error code, message) for anything a command raised."""
    if isinstance(e, CliFailure):
        return e.exit_code, e.code, str(e)
    if isinstance(e, PermissionDeniedError):
        return PERMISSION_DENIED, e.code, str(e)
    if isinstance(e, NotFoundError):
        return NOT_FOUND, e.code, str(e)
    if isinstance(e, InvalidInputError):
        return BAD_INPUT, e.code, str(e)
    if isinstance(e, InvalidStateError):
        return INVALID_STATE, e.code, str(e)
    if isinstance(e, AgentWorkerError):
        return FAILED, e.code, str(e)
    if _is_usage_error(e):
        return BAD_INPUT, "usage", str(getattr(e, "format_message", e.__str__)())
    if isinstance(e, TimeoutError):
        return FAILED, "timeout", str(e) or "timed out"
    if _is_database_error(e):
        return FAILED, "store_unavailable", f"database error: {getattr(e, 'orig', None)!r}"
    if isinstance(e, ConnectionError | OSError):
        return FAILED, "unavailable", f"{type(e).__name__}: {e}"
    return FAILED, "internal", f"{type(e).__name__}: {e}"


def _is_usage_error(e: BaseException) -> bool:
    """Click's and typer's (which vendors its own click) usage errors, known by
    name: neither click nor typer's copy needs importing to ask."""
    return any(c.__name__ in ("ClickException", "UsageError") for c in type(e).__mro__)


def _is_database_error(e: BaseException) -> bool:
    """SQLAlchemy's ``DBAPIError``. A command that raised one has imported
    SQLAlchemy; when nothing has (``--help``, a usage error), no import is paid
    to find out that ``e`` is something else."""
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(e, exc.DBAPIError)


def report(exit_code: int, code: str, message: str, *, as_json: bool = False) -> int:
    """Write the single error line (a JSON object with ``as_json``: scripts that
    asked for ``--json`` parse errors too) and hand back the exit code."""
    line = " ".join(strip_terminal(str(message)).split())
    if len(line) > 2000:
        line = line[:1997] + "..."
    if as_json:
        sys.stderr.write(json.dumps({"error": {
            "code": code, "message": line, "exit_code": exit_code,
            "meaning": EXIT_MEANINGS.get(exit_code, "failure")}}) + "\n")
    else:
        sys.stderr.write(f"error: {code}: {line}\n")
    sys.stderr.flush()
    return exit_code


def one_of(allowed: Sequence[str]) -> Callable[[str | None], str | None]:
    """An option callback refusing a value outside ``allowed`` (exit 2) and
    listing them: an unknown status used to match nothing and exit 0."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in allowed:
            raise typer.BadParameter(f"{value!r} is not one of: {', '.join(allowed)}")
        return value

    return check


def fail(exit_code: int, code: str, message: str) -> NoReturn:
    raise CliFailure(exit_code, code, message)


__all__ = ["BAD_INPUT", "EXIT_MEANINGS", "FAILED", "INTERRUPTED", "INVALID_STATE", "NOT_FOUND",
           "OK", "PERMISSION_DENIED", "CliFailure", "JsonOpt", "ago", "classify", "client",
           "console", "emit_json", "fail", "jsonable", "one_of", "parse_json_arg", "report", "span",
           "sql_store", "styled_status"]
