"""The first hour of a new user, as CI runs it: a fresh clone of this commit,
the README's two set-up commands, then the README's "first hour" walkthrough
commands in order. Any non-zero exit or traceback fails it.

The clone's ``.venv`` (where install.sh installs) is made here first, with this
test's own environment's packages on its path (a ``.pth`` line), so install.sh's
``pip install -e`` finds every dependency there and needs no download; the
editable install it makes is the clone's own. It runs on the test
session's database and Redis database; ``AGENT_WORKER_DEMO_RUNS`` shortens the
demo to two runs (the SIGKILL and the recovery still happen), and test.sh gets
one small test file as its pytest arguments, as the README allows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import ROOT, seeded_venv
from tests.support_docs import readme_walkthrough

# The whole walkthrough on a fresh clone: its steps carry their own
# timeouts (demo.sh and test.sh 300 s each), which name the step that hung; the
# test's own timeout stays above them so they fire first.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

FLOWER_PORT = 5555  # the walkthrough's curl talks to the demo's Flower there
CONSOLE_PORT = 8090  # the demo's console


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _sh(command: str, clone: Path, env: dict[str, str],
        timeout: float) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    print(f"{time.monotonic() - started:6.1f}s  {command}")  # shown with -s or on failure
    return done


def _assert_clean(command: str, done: subprocess.CompletedProcess[str]) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, f"{command} printed a traceback:\n{output[-4000:]}"
    return output


def test_first_hour_on_a_fresh_clone(database_url: str, broker_url: str,
                                     tmp_path: Path) -> None:
    if shutil.which("git") is None or os.geteuid() != 0:
        pytest.skip("needs git and root (the README's commands are written for root)")
    for port, who in ((FLOWER_PORT, "Flower"), (CONSOLE_PORT, "console")):
        if _port_taken(port):
            if os.environ.get("CI"):
                pytest.fail(f"port {port} is taken; the demo's {who} needs it")
            pytest.skip(f"port {port} is taken on this machine (another {who})")
    clone = tmp_path / "agent-worker"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=60)
    venv = seeded_venv(clone / ".venv")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENT_WORKER_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:{os.environ['PATH']}", VIRTUAL_ENV=str(venv),
               AGENT_WORKER_DATABASE_URL=database_url, AGENT_WORKER_BROKER_URL=broker_url,
               AGENT_WORKER_DEMO_RUNS="2")
    try:
        ran = _sh("deploy/local/demo.sh", clone, env, timeout=300)
        demo = _assert_clean("deploy/local/demo.sh", ran)
        assert "demo OK" in demo and "The fleet is still running" in demo, demo[-3000:]
        assert "WARNING" not in demo, "the installers' warnings reached the demo's output"
        # The last lines say where to look, the console (address and login) last.
        password = (clone / ".data/console-auth").read_text().split(":", 1)[1]
        assert f"Console    http://127.0.0.1:{CONSOLE_PORT}" in demo
        assert f"password {password}" in "".join(ran.stdout.rstrip().splitlines()[-3:])
        after_kill = demo.split("SIGKILLed worker 1", 1)[1].split("demo OK")[0]
        assert "  ... " in after_kill, "no progress line while the runs recover"
        logdir = Path(demo.split("logs in ", 1)[1].split(";", 1)[0])
        worker_logs = "".join(f.read_text(errors="replace") for f in logdir.glob("worker*.log"))
        assert "ready." in worker_logs and "superuser privileges" not in worker_logs
        _assert_clean("deploy/local/test.sh", _sh(
            "deploy/local/test.sh -p no:cacheprovider tests/unit/test_readme.py", clone, env,
            timeout=300))
        for command in readme_walkthrough():
            _assert_clean(command, _sh(command, clone, env, timeout=180))
    finally:
        _sh("python -m agent_worker.demo.orchestrate --stop; deploy/local/services.sh stop",
            clone, env, timeout=120)
        _forget_moved_pg_data(clone)


def _forget_moved_pg_data(clone: Path) -> None:
    """services.sh keeps the data of a checkout Postgres cannot enter under
    /var/lib/agent-worker/<hash of the checkout path>: remove the clone's."""
    import hashlib

    moved = Path("/var/lib/agent-worker") / hashlib.sha256(
        str(clone).encode()).hexdigest()[:12]
    shutil.rmtree(moved, ignore_errors=True)
