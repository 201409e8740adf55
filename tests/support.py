"""Real services for tests and benchmarks (``bench/`` imports this module too):
a Redis database of one's own, Celery worker / beat processes in their own
process groups so a caller can SIGKILL a whole worker like a node loss, and
``wait_for``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
TEST_AGENTS = "agent_worker.demo.refund_desk,tests.agents"


def default_timing() -> dict[str, str]:
    """The default timing settings, as environment overrides for fleets whose
    fixture shortened them (short timings hid bug 10 of issue 14)."""
    from agent_worker.settings import Settings

    return {f"AGENT_WORKER_{name.upper()}": str(Settings.model_fields[name].default)
            for name in ("lease_ttl_seconds", "heartbeat_interval_seconds",
                         "sweep_interval_seconds", "queued_overdue_seconds",
                         "retry_backoff_seconds")}


def wait_for(cond: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1,
             what: str = "condition") -> Any:
    """Poll ``cond`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def lock_redis_db(numbers: Iterable[int]) -> tuple[IO[str], int] | None:
    """The first Redis database number in ``numbers`` no other session holds,
    with its lock file (held while open), or ``None`` if all are taken. Test
    sessions and benchmarks share the lock files, so no two of them (xdist
    workers, other checkouts, a benchmark) ever eat each other's laps."""
    for db in numbers:
        lock = open(f"/tmp/agent-worker-test-redis-{db}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return lock, db
    return None


class Proc:
    """A subprocess in its own process group."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        self.popen = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (the worker and its pool children)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        if sig in (signal.SIGKILL,):
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            if self.popen is not None:
                self.popen.wait()
            return
        self.kill(signal.SIGTERM)
        try:
            assert self.popen is not None
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-g", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split() if int(p) != self.pid]

    def lap_pids(self) -> list[int]:
        """The processes that run this worker's laps (the pid in a lease owner):
        the pool children under prefork, the worker itself under threads."""
        return self.children() or [self.pid]


class Fleet:
    """Workers and a beat for one test; everything is killed at teardown."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env, self.logdir = env, logdir
        self.procs: list[Proc] = []
        self._n = 0

    def worker(self, concurrency: int = 2, queues: str | None = None,
               **env: str) -> Proc:
        self._n += 1
        # No --pool: AGENT_WORKER_WORKER_POOL decides, as in a deployment (the
        # worker_env fixture takes it from AGENT_WORKER_TEST_POOL, default prefork).
        args = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--loglevel", "INFO",
                "--concurrency", str(concurrency), "--without-mingle",
                "--without-gossip", "-n", f"w{self._n}-{os.getpid()}@%h"]
        if queues:
            args += ["--queues", queues]
        p = Proc(args, {**self.env, **env}, self.logdir / f"worker{self._n}.log").start()
        self.procs.append(p)
        return p

    def beat(self, **env: str) -> Proc:
        sched = self.logdir / f"beat-{len(self.procs)}.db"
        args = [sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel", "INFO",
                "-s", str(sched)]
        p = Proc(args, {**self.env, **env}, self.logdir / "beat.log").start()
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.kill(signal.SIGKILL)


def logs(fleet: Fleet) -> str:
    return "\n".join(p.log.read_text(errors="replace")[-3000:] for p in fleet.procs
                     if p.log.exists())
