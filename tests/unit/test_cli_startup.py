"""``agent-worker --version`` and a cheap start.

``--help`` and ``--version`` must print fast. How fast depends on the machine
and its load, so the time itself is measured by ``python -m bench.cli_startup``;
these tests check what makes it fast, which does not depend on the load: the
two commands import none of SQLAlchemy, Celery, the public API or the store
(the command modules import those inside the commands that use them). And the
console script imports an application's agents from the folder it runs in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path

import pytest

#: What neither ``--help`` nor ``--version`` may load: together most of the
#: second every command used to spend importing.
HEAVY = ("sqlalchemy", "celery", "kombu", "alembic", "pydantic", "agent_worker.api",
         "agent_worker.store", "agent_worker.tasks", "agent_worker.core.settings")


def _cli() -> list[str]:
    """The installed console script, as a user runs it (else ``python -m``)."""
    script = Path(sys.executable).parent / "agent-worker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_worker.cli"]


def _run(*args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_cli(), *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=env)


def test_version_prints_the_installed_distributions_version() -> None:
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"agent-worker {metadata.version('agent-worker')}\n"
    assert done.stderr == ""


def test_help_lists_the_commands_and_the_version_option() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: agent-worker [OPTIONS] COMMAND [ARGS]...")
    for shown in ("--version", "submit", "approve", "runs", "worker", "db", "console"):
        assert shown in done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    """In a fresh interpreter: importing the CLI and running the command loads
    none of ``HEAVY``."""
    probe = (
        "import io, json, sys\n"
        "from contextlib import redirect_stdout\n"
        "from agent_worker.cli import main\n"
        "with redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({argv!r})\n"
        "loaded = sorted(m for m in sys.modules\n"
        f"                if any(m == h or m.startswith(h + '.') for h in {HEAVY!r}))\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'loaded': loaded}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["code"] == 0
    assert seen["out"].strip()
    assert seen["loaded"] == []


def test_the_console_script_imports_agent_modules_from_the_working_directory(
        tmp_path: Path) -> None:
    """``AGENT_WORKER_AGENT_MODULES=<module> agent-worker worker`` finds the
    application's ``<module>.py`` in the folder it runs in, as ``python -m``
    and ``celery -A`` would (the script's own ``sys.path[0]`` is its bin folder)."""
    module = f"cwd_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from agent_worker import Agent, ScriptedModel, register, turn\n\n"
        "register(Agent(name='from-cwd', model=ScriptedModel(lambda r: turn('done'))))\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENT_WORKER_WORKER_VERSIONS"}
    env["AGENT_WORKER_AGENT_MODULES"] = module
    done = _run("worker", "--dry-run", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert "laps.from-cwd.v1" in argv[argv.index("--queues") + 1].split(",")
