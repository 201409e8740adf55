"""``deploy/local/install.sh`` is quiet unless an installer fails: the demo's
first screen used to be 60 lines of pip's warnings about this machine's
package index configuration. The installers are replaced by fakes on PATH
that print such warnings, so nothing is installed: the fake ``python3``'s
``-m venv DIR`` makes a virtual environment whose ``python`` is the fake pip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARNING = "WARNING: Location 'file:///opt/x/simple/click/' is ignored"


def fake_bin(tmp_path: Path, pip_exit: int, missing: tuple[str, ...] = ()) -> Path:
    """Fake installers on a directory for PATH; the programs install.sh looks for
    are present unless named in ``missing``; apt-get appends its arguments to
    ``apt-get.args`` next to the directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    present = {name: "exit 0" for name in ("redis-server", "promtool", "pg_config", "chromium")
               if name not in missing}
    scripts = {
        # What install.sh looks for before it calls apt-get: present, so no apt.
        **present,
        "apt-get": f'echo "$@" >> {tmp_path / "apt-get.args"}; echo {WARNING!r} >&2; exit 0',
        "pip": f"echo {WARNING!r} >&2; echo 'ERROR: no matching distribution' >&2; "
               f"exit {pip_exit}",
        # ``python3 -m venv DIR``: DIR/bin/python is the fake pip above.
        "python3": f'mkdir -p "$3/bin" && cp {bin_dir / "pip"} "$3/bin/python"',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def run_install(tmp_path: Path, pip_exit: int, missing: tuple[str, ...] = (),
                system_path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    env = {**os.environ, "PATH": f"{fake_bin(tmp_path, pip_exit, missing)}:{system_path}",
           "TMPDIR": str(tmp_path), "AGENT_WORKER_VENV": str(tmp_path / "venv")}
    return subprocess.run([bash, str(ROOT / "deploy/local/install.sh")], env=env,
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


def test_install_asks_apt_for_chromium_when_no_browser_is_installed(tmp_path: Path) -> None:
    """The browser tests need the OS's Chromium (Playwright's download is
    unreachable): a machine without it gets the Debian package. Only the few
    tools install.sh itself uses are on PATH, so a real chromium is not found."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("mktemp", "dirname", "rm", "cat", "ls", "env", "mkdir", "cp"):
        found = shutil.which(name)
        assert found is not None, name
        (tools / name).symlink_to(found)
    result = run_install(tmp_path, pip_exit=0, missing=("chromium",), system_path=str(tools))
    assert result.returncode == 0, result.stderr
    assert "chromium" in result.stdout
    installs = [line.split() for line in (tmp_path / "apt-get.args").read_text().splitlines()
                if line.startswith("install")]
    assert installs and "chromium" in installs[0], installs


def test_install_puts_the_package_in_its_own_virtual_environment(tmp_path: Path) -> None:
    """Never the machine's interpreter: the venv is made, and pip runs as its python."""
    result = run_install(tmp_path, pip_exit=0)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "venv/bin/python").exists()
    assert f"into {tmp_path / 'venv'}" in result.stdout
    assert f". {tmp_path / 'venv'}/bin/activate" in result.stdout
