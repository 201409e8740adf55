"""``deploy/local/install.sh`` is quiet unless an installer fails: the demo's
first screen used to be 60 lines of pip's warnings about this machine's
package index configuration. The installers are replaced by fakes on PATH
that print such warnings, so nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARNING = "WARNING: Location 'file:///opt/x/simple/click/' is ignored"


def fake_bin(tmp_path: Path, pip_exit: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        # What install.sh looks for before it calls apt-get: present, so no apt.
        "redis-server": "exit 0", "promtool": "exit 0", "pg_config": "exit 0",
        "apt-get": f"echo {WARNING!r} >&2; exit 0",
        "python": f"echo {WARNING!r} >&2; echo 'ERROR: no matching distribution' >&2; "
                  f"exit {pip_exit}",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def run_install(tmp_path: Path, pip_exit: int) -> subprocess.CompletedProcess[str]:
    if shutil.which("bash") is None:
        pytest.skip("bash not installed")
    env = {**os.environ, "PATH": f"{fake_bin(tmp_path, pip_exit)}:/usr/bin:/bin",
           "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", str(ROOT / "deploy/local/install.sh")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_install_hides_installer_output_when_it_succeeds(tmp_path: Path) -> None:
    result = run_install(tmp_path, pip_exit=0)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert result.stdout.strip().startswith("install:")


def test_install_shows_installer_output_when_it_fails(tmp_path: Path) -> None:
    result = run_install(tmp_path, pip_exit=1)
    assert result.returncode != 0
    assert "no matching distribution" in result.stderr
    assert "failed" in result.stderr
