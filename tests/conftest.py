"""Fixtures: real Postgres and Redis (started by deploy/local/services.sh when
not given), one fresh database per test session, Celery fleets per test.

Locally a missing service skips the tests that need it; in CI (``CI`` set) it
fails them, so crash-safety evidence can never silently disappear."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker.agent import Registry
from tests.support import ROOT, TEST_AGENTS, Fleet, lock_redis_db, logs

PG_ADMIN = os.environ.get("AGENT_WORKER_TEST_PG", "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker")
REDIS = os.environ.get("AGENT_WORKER_TEST_REDIS", "redis://127.0.0.1:63799")


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"required service unavailable in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def agent_registry() -> Registry:
    """A fresh agent registry for one test's worker (``w.rt.registry =
    agent_registry``): what one test registers never leaks into another through
    the process-wide ``agent_worker.registry``."""
    return Registry()


@pytest.fixture(scope="session")
def services() -> None:
    if "AGENT_WORKER_TEST_PG" not in os.environ:
        done = subprocess.run([str(ROOT / "deploy/local/services.sh"), "start"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            _unavailable(f"could not start local services: {done.stderr[-500:]}")


@pytest.fixture(scope="session")
def database_url(services: None) -> Iterator[str]:
    from sqlalchemy import create_engine, text

    from store.migrate import upgrade

    name = f"aw_test_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:
        _unavailable(f"postgres not reachable at {PG_ADMIN}: {e}")
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    upgrade(url)
    _install_test_clock(url, name)
    yield url
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _install_test_clock(url: str, name: str) -> None:
    """Give the test database a clock tests can move: every lease, timer and
    timeout is compared on the database's ``now()`` (store.dbtime), so moving
    worker clocks no longer fires a timer. A ``now()`` that adds
    ``testclock.shift`` comes before ``pg_catalog`` on the database's
    search_path; production databases have no such schema."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text("CREATE SCHEMA testclock"))
        c.execute(text("CREATE TABLE testclock.shift (seconds double precision NOT NULL)"))
        c.execute(text("INSERT INTO testclock.shift VALUES (0)"))
        c.execute(text(
            "CREATE FUNCTION testclock.now() RETURNS timestamptz LANGUAGE sql STABLE AS "
            "$$ SELECT pg_catalog.now() + make_interval(secs => "
            "(SELECT seconds FROM testclock.shift)) $$"))
        c.execute(text(f'ALTER DATABASE "{name}" SET search_path = '
                       '"$user", public, testclock, pg_catalog'))
    engine.dispose()


class DatabaseClock:
    """Moves the test database's time (and so every lease, timer and timeout)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")

    def advance(self, **delta: float) -> None:
        from datetime import timedelta

        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("UPDATE testclock.shift SET seconds = seconds + :s"),
                      {"s": timedelta(**delta).total_seconds()})

    def reset(self) -> None:
        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("UPDATE testclock.shift SET seconds = 0"))
        self.engine.dispose()


@pytest.fixture
def db_clock(database_url: str) -> Iterator[DatabaseClock]:
    """The database's clock for one test; set back when the test ends, so a
    jump of days cannot make later tests' timeouts fire early."""
    clock = DatabaseClock(database_url)
    yield clock
    clock.reset()


@pytest.fixture(scope="session")
def broker_url(services: None) -> Iterator[str]:
    import redis

    # Each concurrent test session (xdist worker, another checkout) takes its own
    # Redis database, held by a lock file, so no worker eats another's laps.
    taken = lock_redis_db(range(1, 16))
    if taken is None:
        pytest.fail("all 15 Redis test databases are in use")
    lock, db = taken
    url = f"{REDIS}/{db}"
    try:
        r = redis.Redis.from_url(url)
        r.flushdb()
        r.close()
    except Exception as e:
        lock.close()
        _unavailable(f"redis not reachable at {url}: {e}")
    yield url
    lock.close()


@pytest.fixture
def worker_env(database_url: str, broker_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for worker, beat and CLI subprocesses: short leases and sweeps
    so recovery happens within a test's patience."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env.update(
        PYTHONPATH=str(ROOT),
        AGENT_WORKER_DATABASE_URL=database_url,
        AGENT_WORKER_BROKER_URL=broker_url,
        AGENT_WORKER_AGENT_MODULES=TEST_AGENTS,
        AGENT_WORKER_LEASE_TTL_SECONDS="3",
        AGENT_WORKER_HEARTBEAT_INTERVAL_SECONDS="1",
        AGENT_WORKER_SWEEP_INTERVAL_SECONDS="0.5",
        AGENT_WORKER_QUEUED_OVERDUE_SECONDS="5",
        AGENT_WORKER_RETRY_BACKOFF_SECONDS="0.2",
        AGENT_WORKER_FAULT_DIR=str(tmp_path / "faults"),
        # The pool every test worker runs: AGENT_WORKER_TEST_POOL=threads runs the
        # integration and chaos suites under the IO-bound fleets' pool.
        AGENT_WORKER_WORKER_POOL=os.environ.get("AGENT_WORKER_TEST_POOL", "prefork"),
    )
    return env


@pytest.fixture
def fleet(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(worker_env, tmp_path)
    yield f
    f.close()
    if os.environ.get("AGENT_WORKER_TEST_LOGS"):
        print(logs(f))


@pytest.fixture
def aw(worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An ``AgentWorker`` for the test process, on the same database and broker."""
    import agent_worker.api as api
    from agent_worker.settings import get_settings

    for k, v in worker_env.items():
        if k.startswith("AGENT_WORKER_"):
            monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    from tasks import app

    app.conf.update(broker_url=worker_env["AGENT_WORKER_BROKER_URL"])
    api.configure(None)
    client = api.client()
    yield client

    client.rt.store.dispose()
    api.configure(None)
    get_settings.cache_clear()
