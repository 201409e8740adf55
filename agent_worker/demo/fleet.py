"""The demo's processes: started in their own process groups, and either torn
down when the demo ends or kept running for the newcomer to look around, with
their pids in a small JSON file so ``deploy/local/demo.sh --stop`` (or the next
demo) can stop them later from another shell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# What a kept process's command line must contain before we signal its pid:
# after a reboot the pid may belong to someone else.
OURS = ("celery", "agent_worker.demo.vendor", "agent_worker.cli console")

# Celery warns that the worker runs as root; the demo does, on a throwaway
# machine (README, "Running as root", says what to do in production).
QUIET_ROOT = ["-W", "ignore:You're running the worker with superuser privileges"]


@dataclass
class Fleet:
    """The demo's processes, by role."""

    logdir: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_pids: dict[str, int] = field(default_factory=dict)

    def spawn(self, role: str, args: list[str],
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``python args`` as ``role``; ``extra_env`` only for this process
        (the console's users stay out of the workers' environment)."""
        with open(self.logdir / f"{role}.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, *QUIET_ROOT, *args],
                                    env={**self.env, **(extra_env or {})},
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[role] = proc
        return proc

    def worker(self, n: int) -> subprocess.Popen[bytes]:
        return self.spawn(f"worker{n}", ["-m", "celery", "-A", "agent_worker.tasks", "worker",
                                         "--loglevel",
                                         "INFO", "--concurrency", "2", "-n", f"demo{n}@%h",
                                         "--without-mingle"])

    def kill(self, role: str, sig: int = signal.SIGKILL) -> int:
        proc = self.procs.pop(role)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        return proc.pid

    def pids(self) -> dict[str, int]:
        return {**{r: p.pid for r, p in self.procs.items() if p.poll() is None},
                **self.extra_pids}

    def stop(self) -> None:
        stop_pids(self.pids())

    def save(self, path: Path, **about: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pids": self.pids(), "logs": str(self.logdir), **about}))


def _ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return any(mark in cmdline for mark in OURS)


def stop_pids(pids: dict[str, int], timeout: float = 15.0) -> list[str]:
    """SIGTERM each process group, then SIGKILL what is left; the roles stopped."""
    live = {role: pid for role, pid in pids.items() if _ours(pid)}
    for pid in live.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_ours(p) for p in live.values()):
        time.sleep(0.2)
    for pid in live.values():
        if _ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return sorted(live)


def stop_saved(path: Path) -> list[str]:
    """Stop the fleet a kept demo recorded in ``path``; the roles stopped."""
    if not path.exists():
        return []
    try:
        pids = {str(k): int(v) for k, v in json.loads(path.read_text())["pids"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        pids = {}
    stopped = stop_pids(pids)
    path.unlink()
    return stopped


__all__ = ["QUIET_ROOT", "Fleet", "stop_pids", "stop_saved"]
