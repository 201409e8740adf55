"""The console as its users meet it: ``agent-worker console`` started as a
subprocess on a free loopback port (in its own process group, like the test
fleets' workers), with configured users whose passwords only the caller knows.
The browser tests and ``bench.screenshots`` share it."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent_worker.console.users import hash_password
from tests.support import Proc, answers, wait_for

#: A page that answers 200 without a login once the console serves.
READY_PATH = "/healthz"


@dataclass(frozen=True)
class User:
    """A console user to configure: its principal and its password."""

    id: str
    tenant: str
    roles: tuple[str, ...]
    password: str


@dataclass(frozen=True)
class Cast:
    """The console's users for a module, all in one fresh tenant: ``approver``
    may decide gifts; ``viewer`` is in the gift desk's group but has no
    approver role; ``operator`` runs the fleet (retry, cancel, ...)."""

    tenant: str
    approver: User
    viewer: User
    operator: User

    @property
    def users(self) -> tuple[User, ...]:
        return (self.approver, self.viewer, self.operator)


def users_json(users: Iterable[User]) -> str:
    """``AGENT_WORKER_CONSOLE_USERS`` for ``users``: only hashes leave the caller."""
    return json.dumps([{"id": u.id, "tenant": u.tenant, "roles": list(u.roles),
                        "password_hash": hash_password(u.password)} for u in users])


def free_port() -> int:
    """A loopback port nobody listens on now (the console binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ConsoleServer:
    """``python -m agent_worker.cli console`` on ``port``; ``url`` once started."""

    def __init__(self, env: dict[str, str], log: Path, users: Iterable[User],
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**env, "AGENT_WORKER_CONSOLE_USERS": users_json(users)}
        self.proc = Proc([sys.executable, "-m", "agent_worker.cli", "console",
                          "--host", "127.0.0.1", "--port", str(self.port)], env, log)

    def start(self, timeout: float = 60.0) -> ConsoleServer:
        """Start it and wait until it serves; fail with its log if it died."""
        self.proc.start()
        wait_for(lambda: not self.proc.alive() or answers(self.url + READY_PATH),
                 timeout=timeout, interval=0.2, what=f"the console to serve {self.url}")
        if not self.proc.alive():
            raise AssertionError("the console exited at start:\n"
                                 + self.proc.log.read_text(errors="replace")[-3000:])
        return self

    def stop(self) -> None:
        self.proc.stop()


__all__ = ["READY_PATH", "Cast", "ConsoleServer", "User", "free_port", "users_json"]
