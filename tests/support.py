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
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import pytest

from bench.dropping import drop_retrying

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from agent_worker.api import AgentWorker
    from agent_worker.store.base import RunRecord

ROOT = Path(__file__).resolve().parent.parent
TEST_AGENTS = "agent_worker.demo.refund_desk,tests.agents"


#: The pool every test worker runs: AGENT_WORKER_TEST_POOL=threads runs the
#: integration and chaos suites under the IO-bound fleets' pool (README).
TEST_POOL = os.environ.get("AGENT_WORKER_TEST_POOL", "prefork")


def default_timing() -> dict[str, str]:
    """The default timing settings, as environment overrides for fleets whose
    fixture shortened them (short timings hid a slow recovery of a lost lap message)."""
    from agent_worker.core.settings import Settings

    return {f"AGENT_WORKER_{name.upper()}": str(Settings.model_fields[name].default)
            for name in ("lease_ttl_seconds", "heartbeat_interval_seconds",
                         "sweep_interval_seconds", "queued_overdue_seconds",
                         "retry_backoff_seconds")}


def unavailable(why: str) -> NoReturn:
    """Skip the test locally when something it needs (a service, the browser) is
    missing; fail it in CI (``CI`` set), so evidence never silently disappears."""
    if os.environ.get("CI"):
        pytest.fail(f"required service unavailable in CI: {why}")
    pytest.skip(why)


def worker_environ(database_url: str, broker_url: str, fault_dir: Path,
                   agent_modules: str = TEST_AGENTS) -> dict[str, str]:
    """Environment for worker, beat, CLI and console subprocesses: this process's
    environment without its ``AGENT_WORKER_*``, the test services, and short
    leases and sweeps so recovery happens within a test's patience."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env.update(
        PYTHONPATH=str(ROOT),
        AGENT_WORKER_DATABASE_URL=database_url,
        AGENT_WORKER_BROKER_URL=broker_url,
        AGENT_WORKER_AGENT_MODULES=agent_modules,
        AGENT_WORKER_LEASE_TTL_SECONDS="3",
        AGENT_WORKER_HEARTBEAT_INTERVAL_SECONDS="1",
        AGENT_WORKER_SWEEP_INTERVAL_SECONDS="0.5",
        AGENT_WORKER_QUEUED_OVERDUE_SECONDS="5",
        AGENT_WORKER_RETRY_BACKOFF_SECONDS="0.2",
        AGENT_WORKER_FAULT_DIR=str(fault_dir),
        AGENT_WORKER_WORKER_POOL=TEST_POOL,
    )
    return env


def client_on(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentWorker]:
    """An ``AgentWorker`` for the test process on ``env``'s database and broker
    (the ``aw`` fixture; module-scoped fixtures pass ``MonkeyPatch.context()``):
    its ``AGENT_WORKER_*`` set, settings re-read, and all of it undone after."""
    import agent_worker.api as api
    from agent_worker.core.settings import get_settings

    for k, v in env.items():
        if k.startswith("AGENT_WORKER_"):
            monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    from agent_worker.tasks import app

    app.conf.update(broker_url=env["AGENT_WORKER_BROKER_URL"])
    api.configure(None)
    client = api.client()
    yield client

    client.rt.store.dispose()
    api.configure(None)
    get_settings.cache_clear()


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 within two seconds (a server's readiness probe)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def drop_database(admin: Engine, name: str, attempts: int = 50) -> None:
    """Drop a test database, sessions and all, waiting out an autovacuum
    worker on it (``bench.dropping``)."""
    from sqlalchemy import text

    def execute(sql: str) -> None:
        with admin.connect() as c:
            c.execute(text(sql))

    drop_retrying(execute, name, attempts=attempts)


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


def run_reaching(aw: AgentWorker, run_id: str, status: str, *,
                 timeout: float = 60.0) -> RunRecord:
    """The run once its status is ``status`` (workers move it, the database says
    when); fails after ``timeout`` seconds naming the run and the status."""
    def reached() -> RunRecord | None:
        run = aw.get_run(run_id)
        return run if run.status == status else None

    found: RunRecord = wait_for(reached, timeout=timeout, interval=0.2,
                                what=f"run {run_id} to be {status}")
    return found


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

    def __init__(self, args: list[str], env: dict[str, str], log: Path,
                 cwd: Path = ROOT) -> None:
        self.args, self.env, self.log, self.cwd = args, env, log, cwd
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        self.popen = subprocess.Popen(self.args, env=self.env, cwd=self.cwd, stdout=out,
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
        """The other processes of this one's process group (a prefork pool's
        children), read from ``/proc``: spawning ``pgrep`` cost about 4 ms of
        CPU a call, which ``bench.iobound``'s 0.2 s polling counted as the
        fleet's (a quarter of a millisecond a lap)."""
        return [pid for pid in _process_group(self.pid) if pid != self.pid]

    def lap_pids(self) -> list[int]:
        """The processes that run this worker's laps (the pid in a lease owner):
        the pool children under prefork, the worker itself under threads."""
        return self.children() or [self.pid]


def process_stats() -> Iterator[tuple[int, bytes, list[bytes]]]:
    """Each running process: its pid, its name and the fields of
    ``/proc/<pid>/stat`` after the name (state, ppid, pgrp, ...; ``proc(5)``
    numbers them from 3). One that is gone meanwhile is skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # The name sits in parentheses and may itself hold spaces or parentheses.
        head, _, rest = stat.rpartition(b")")
        yield int(entry), head.partition(b"(")[2], rest.split()


def _process_group(pgid: int) -> list[int]:
    """The pids whose process group is ``pgid`` (``pgrep -g``)."""
    return [pid for pid, _name, fields in process_stats() if int(fields[2]) == pgid]


@contextlib.contextmanager
def supervised(proc: Proc, interval: float = 0.2) -> Iterator[Proc]:
    """Start ``proc`` again whenever it dies, as deploy's systemd unit and
    Kubernetes do: under the threads pool a fault that kills a lap kills the
    worker itself, where prefork's main process would replace the pool child."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            if not proc.alive():
                proc.start()

    watcher = threading.Thread(target=watch, name="supervisor", daemon=True)
    watcher.start()
    try:
        yield proc
    finally:
        stop.set()
        watcher.join()


def lease_holder(owner: str | None, procs: Iterable[Proc]) -> Proc | None:
    """The live worker among ``procs`` one of whose lap processes (its pool
    children, or itself under threads) holds a lease owned by ``owner``
    (owners look like ``host:pid:nonce``), if any."""
    if not owner:
        return None
    pid = int(owner.split(":")[1])
    return next((p for p in procs if p.alive() and pid in p.lap_pids()), None)


def lap_holder(aw: AgentWorker, run_id: str, procs: Iterable[Proc]) -> tuple[Proc, int] | None:
    """The worker among ``procs`` running a lap of ``run_id`` now, and that
    lap (``RunRecord.lap``), if one of them is."""
    run = aw.get_run(run_id)
    holder = lease_holder(run.lease_owner, procs) if run.status == "running" else None
    return (holder, run.lap) if holder is not None else None


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
        # worker_env fixture takes it from TEST_POOL).
        args = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "worker",
                "--loglevel", "INFO",
                "--concurrency", str(concurrency), "--without-mingle",
                "--without-gossip", "-n", f"w{self._n}-{os.getpid()}@%h"]
        if queues:
            args += ["--queues", queues]
        p = Proc(args, {**self.env, **env}, self.logdir / f"worker{self._n}.log").start()
        self.procs.append(p)
        return p

    def beat(self, **env: str) -> Proc:
        sched = self.logdir / f"beat-{len(self.procs)}.db"
        args = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "beat",
                "--loglevel", "INFO",
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


def seeded_venv(path: Path) -> Path:
    """A new virtual environment at ``path`` that also sees this test run's
    installed packages (a ``.pth`` line naming their folder), so installing a
    package into it needs no download. The folder's own ``.pth`` files (this
    checkout's editable install) are not read from there: only what is
    installed into the new environment itself is importable as
    ``agent_worker``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=120)
    here = next(p for p in sys.path if p.endswith("site-packages") and
                Path(p).resolve().is_relative_to(Path(sys.prefix).resolve()))
    there = next((path / "lib").glob("python*/site-packages"))
    (there / "_agent_worker_test_deps.pth").write_text(here + "\n")
    return path
