"""``agent-worker console``: serve the run console; ``agent-worker console
hash-password``: the hash to put in ``AGENT_WORKER_CONSOLE_USERS``.

Registered by ``agent_worker.cli`` with one line, so the console's own command
line lives with the console.
"""

from __future__ import annotations

import getpass
import sys
from typing import Annotated

import typer

from agent_worker.console.users import UserBook, hash_password
from agent_worker.core.errors import InvalidInputError

#: How long a stopping console waits for open requests (live streams included).
SHUTDOWN_SECONDS = 5

app = typer.Typer(help="The run console: runs, laps, approvals and actions in a browser.",
                  invoke_without_command=True, no_args_is_help=False)


@app.callback()
def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(
        help="Address to listen on (default AGENT_WORKER_CONSOLE_BIND: 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(
        help="Port (default AGENT_WORKER_CONSOLE_PORT: 8090).")] = None,
) -> None:
    """Serve the run console (until interrupted); refuses to start with a
    placeholder session key or database password."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn  # the server, only when serving: hash-password needs none of it

    from agent_worker.console.app import create_app
    from agent_worker.core.settings import get_settings  # nor --help: pydantic-settings is slow

    settings = get_settings()
    users = UserBook.parse(settings.console_users)  # a bad file fails here, not at login
    if not users.users:
        sys.stderr.write("warning: AGENT_WORKER_CONSOLE_USERS names nobody; "
                         "nobody can log in\n")
    bind = host or settings.console_bind
    chosen = port if port is not None else settings.console_port
    # Refuses a placeholder session key or database/broker password, before serving.
    console = create_app(settings=settings, users=users)
    sys.stdout.write(f"serving the run console on http://{bind}:{chosen}/\n")
    sys.stdout.flush()
    # uvicorn's own proxy headers stay off: the app believes the forwarded
    # headers of AGENT_WORKER_CONSOLE_TRUSTED_PROXIES only (console.security).
    # A stop waits at most a few seconds for open live streams (they would
    # otherwise hold it for their whole lifetime); browsers reconnect.
    uvicorn.run(console, host=bind, port=chosen, log_level="warning", proxy_headers=False,
                timeout_graceful_shutdown=SHUTDOWN_SECONDS)


@app.command("hash-password")
def hash_password_command(
    stdin: Annotated[bool, typer.Option(
        "--stdin", help="Read the password from standard input (scripts) instead of "
                        "asking.")] = False,
) -> None:
    """Print the scrypt hash of a password, for a user's password_hash."""
    if stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise InvalidInputError("the two passwords differ")
    sys.stdout.write(hash_password(password) + "\n")


__all__ = ["app"]
