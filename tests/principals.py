"""Acting as someone in tests: the verbs take their actor from the handle's
principal, so a test that needs "alice approved" binds alice."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Any, TypeVar

import pytest

import agent_worker.api as api
from agent_worker.api import AgentWorker
from agent_worker.core.principal import ALL_TENANTS, Principal, default_principal
from agent_worker.core.settings import get_settings
from agent_worker.inprocess import InProcessWorker

W = TypeVar("W", bound=AgentWorker)


def acting(worker: W, who: str, *roles: str, tenant: str = ALL_TENANTS) -> W:
    """``worker`` acting as ``who``: an admin across tenants unless told otherwise."""
    return worker.acting_as(Principal(who, tenant, roles or ("admin",)))


#: ``cli(principal, *argv)``: the exit code, the JSON output (``None`` if
#: none) and stderr of ``agent-worker ... --json`` acting as ``principal``.
PrincipalCli = Callable[..., tuple[int, Any, str]]


@contextmanager
def cli_as(worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch, database_url: str,
           *, settle: bool = False) -> Iterator[PrincipalCli]:
    """The CLI in this process, acting as the principal the
    ``AGENT_WORKER_PRINCIPAL_*`` settings name, as a deployment would set them
    (laps run in ``worker``; ``settle``: until idle after each command)."""
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", database_url)

    def call(who: Principal, *argv: str) -> tuple[int, Any, str]:
        from agent_worker.cli import main  # as the console script does, after the env is set

        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_ID", who.id)
        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_TENANT", who.tenant)
        monkeypatch.setenv("AGENT_WORKER_PRINCIPAL_ROLES", ",".join(sorted(who.roles)))
        get_settings.cache_clear()
        api.configure(worker.acting_as(default_principal(get_settings())))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main([*argv, "--json"])
        if settle:
            worker.run_until_idle()
        return code, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue()

    try:
        yield call
    finally:
        api.configure(None)
        get_settings.cache_clear()


__all__ = ["PrincipalCli", "acting", "cli_as"]
