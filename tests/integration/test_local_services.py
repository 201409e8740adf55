"""``deploy/local/services.sh`` from a checkout the ``postgres`` user cannot
enter (root's home is mode 700 on Debian, the natural place to clone as root):
initdb used to fail with "Permission denied" and no hint. ``stop`` says what it
stopped (it used to print nothing). Runs on ports of its own, so the machine's
shared services are untouched."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_services_start_and_stop_from_a_mode_700_checkout(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root (Postgres runs as the postgres user)")
    home = tmp_path / "root-home"
    checkout = home / "agent-worker"
    for rel in ("deploy/local/services.sh", "deploy/redis/redis.conf",
                "deploy/k8s/postgres-roles.sql"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, checkout / rel)
    home.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_WORKER_DATA_DIR"}
    env.update(PG_PORT=str(free_port()), REDIS_PORT=str(free_port()),
               VENDOR_PORT=str(free_port()))
    script = str(checkout / "deploy/local/services.sh")

    def run(verb: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, verb], env=env, capture_output=True, text=True,
                              timeout=120, check=False)

    started = run("start")
    moved = [line.split()[3] for line in started.stdout.splitlines()
             if line.startswith("postgres: data in ")]
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert moved, started.stdout
        assert f"vendor: http://127.0.0.1:{env['VENDOR_PORT']}" in started.stdout
        assert run("status").returncode == 0
    finally:
        stopped = run("stop")
        for pg in moved:
            shutil.rmtree(Path(pg).parent, ignore_errors=True)
    assert stopped.returncode == 0
    assert f"stopped postgres (port {env['PG_PORT']}" in stopped.stdout
    assert f"stopped redis (port {env['REDIS_PORT']})" in stopped.stdout
    assert f"stopped demo vendor (port {env['VENDOR_PORT']})" in stopped.stdout
