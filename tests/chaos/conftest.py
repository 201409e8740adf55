"""Private Postgres and Redis for fault tests, so restarting them never touches
the shared instances (54329/63799) other engineers' tests are using.

One Postgres cluster per test session (initdb takes seconds) with a fresh
database per test; one Redis process per test on a port fixed for the session
(the test process's Celery producer pool keeps that URL across tests).
``PrivatePostgres`` / ``PrivateRedis`` offer the restarts and outages the tests
inject; ``bench/recovery.py`` reuses them.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support import ROOT, drop_database, wait_for

IS_ROOT = os.geteuid() == 0
PgStop = Literal["smart", "fast", "immediate"]


def _pg_bindir() -> Path:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             check=True).stdout.strip()
        return Path(out)
    except (OSError, subprocess.CalledProcessError):
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not found:
            raise RuntimeError("no PostgreSQL binaries found (pg_config or "
                               "/usr/lib/postgresql/*/bin)") from None
        return found[-1]


def free_port(low: int, high: int) -> int:
    """A port in [low, high) nobody listens on right now (random, so parallel
    sessions rarely race for the same one)."""
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high})")


class PrivatePostgres:
    """A throwaway Postgres cluster in a temp dir, run as the ``postgres`` user
    (initdb and postgres refuse root)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port(55432, 56432)
        self.bindir = _pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="aw-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if IS_ROOT:
            shutil.chown(self.root, "postgres")
        self._as_pg([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8"])

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _as_pg(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["runuser", "-u", "postgres", "--", *args] if IS_ROOT else args
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): "
                               f"{done.stdout[-1000:]}{done.stderr[-1000:]}")
        return done

    def _opts(self) -> str:
        # fsync off: the tests crash Postgres, never the OS, so the page cache keeps
        # every write and crash recovery stays exact; it only spares the shared disk.
        return (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c max_connections=300 -c fsync=off -c full_page_writes=off")

    def start(self) -> None:
        self._as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                     "-w", "-t", "60", "-o", self._opts(), "start"])

    def stop(self, mode: PgStop = "fast") -> None:
        self._as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                     "-t", "60", "stop"], check=False)

    def restart(self, mode: PgStop = "fast") -> float:
        """``pg_ctl restart``: ``fast`` rolls back and disconnects every session,
        ``immediate`` is a crash followed by WAL recovery. Returns the seconds it took."""
        t0 = time.monotonic()
        self._as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                     "-m", mode, "-w", "-t", "60", "-o", self._opts(), "restart"])
        return time.monotonic() - t0

    def outage(self, seconds: float, mode: PgStop = "immediate") -> None:
        """Unreachable for ``seconds``: stop, wait (the fault itself), start."""
        self.stop(mode)
        time.sleep(seconds)
        self.start()

    def ready(self) -> bool:
        return self._as_pg([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p",
                            str(self.port), "-q"], check=False).returncode == 0

    def create_database(self) -> str:
        """A fresh, migrated database; returns its URL."""
        from sqlalchemy import create_engine, text

        from agent_worker.store.migrate import upgrade

        name = f"aw_chaos_{uuid.uuid4().hex[:8]}"
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        url = self.url(name)
        upgrade(url)
        return url

    def drop_database(self, url: str) -> None:
        from sqlalchemy import create_engine

        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            drop_database(admin, url.rsplit("/", 1)[1])
        finally:
            admin.dispose()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A redis-server child process with the deploy configuration (AOF
    everysec, noeviction) or, with ``appendonly=False``, no persistence at all."""

    def __init__(self, port: int | None = None, *, appendonly: bool = True) -> None:
        self.port = port or free_port(64000, 65000)
        self.appendonly = appendonly
        self.dir = Path(tempfile.mkdtemp(prefix="aw-chaos-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> PrivateRedis:
        args = ["redis-server", str(ROOT / "deploy/redis/redis.conf"), "--port", str(self.port),
                "--bind", "127.0.0.1", "--dir", str(self.dir), "--daemonize", "no",
                "--supervised", "no", "--logfile", str(self.dir / "redis.log"),
                "--maxmemory", "256mb"]
        if not self.appendonly:
            args += ["--appendonly", "no", "--save", ""]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(self.ping, timeout=30, interval=0.05, what=f"redis on {self.port}")
        return self

    def ping(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.dir / "redis.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"redis-server exited ({self.proc.returncode}): {log}")
        try:
            c = self.client()
            try:
                return bool(c.ping())
            finally:
                c.close()
        except Exception:
            return False

    def stop(self) -> None:
        """``SHUTDOWN NOSAVE``: with AOF on Redis still flushes the AOF (what a
        restart keeps); without it every queued and unacked message is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            self.client().shutdown(nosave=True)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop, stay down for ``down_seconds`` (the outage itself), start again."""
        self.stop()
        if down_seconds:
            time.sleep(down_seconds)
        self.restarts += 1
        self.start()

    def message_count(self) -> int:
        """Lap messages Redis holds: queued (lists) plus delivered-but-unacked."""
        c = self.client()
        try:
            total = int(c.hlen("unacked"))
            for key in c.scan_iter("laps.*"):
                if c.type(key) == b"list":
                    total += int(c.llen(key))
            return total
        finally:
            c.close()

    def destroy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def reset_producer_pools() -> None:
    """Drop the test process's cached Celery broker connections, so sends go to
    the broker now configured (an earlier test may have used the shared Redis)."""
    from agent_worker.tasks import app

    celery_app: Any = app  # private attributes, not in the type stubs
    with contextlib.suppress(Exception):
        if celery_app._pool is not None:
            celery_app._pool.force_close_all()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


# --- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivatePostgres]:
    try:
        found = shutil.which("redis-server") is not None and (_pg_bindir() / "initdb").exists()
    except RuntimeError:
        found = False
    if not found:
        if os.environ.get("CI"):
            pytest.fail("chaos tests need PostgreSQL server binaries and redis-server")
        pytest.skip("chaos tests need PostgreSQL server binaries and redis-server")
    pg = PrivatePostgres()
    pg.start()
    yield pg
    pg.destroy()


@pytest.fixture(scope="session")
def redis_port() -> int:
    return free_port(64000, 65000)


@pytest.fixture
def private_redis(request: pytest.FixtureRequest, redis_port: int) -> Iterator[PrivateRedis]:
    """A fresh Redis for one test; ``indirect`` parametrization passes
    ``{"appendonly": False}`` for a broker that forgets everything on restart."""
    opts: dict[str, Any] = getattr(request, "param", None) or {}
    r = PrivateRedis(redis_port, appendonly=bool(opts.get("appendonly", True))).start()
    yield r
    r.destroy()


@pytest.fixture
def database_url(private_pg: PrivatePostgres) -> Iterator[str]:
    """Overrides the shared-Postgres fixture: a fresh database on the private cluster."""
    if not private_pg.ready():
        private_pg.start()
    url = private_pg.create_database()
    yield url
    if not private_pg.ready():
        private_pg.start()
    private_pg.drop_database(url)


@pytest.fixture
def broker_url(private_redis: PrivateRedis) -> str:
    """Overrides the shared-Redis fixture."""
    return private_redis.url


@pytest.fixture
def aw(aw: Any) -> Iterator[Any]:
    """The parent ``aw``, with the producer pool pointed at the private broker."""
    reset_producer_pools()
    yield aw
    reset_producer_pools()


__all__ = ["PrivatePostgres", "PrivateRedis", "free_port", "reset_producer_pools"]
