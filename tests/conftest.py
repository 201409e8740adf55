"""Fixtures: real Postgres and Redis (started by deploy/local/services.sh when
not given), one fresh database per test session, Celery fleets per test.

Locally a missing service skips the tests that need it; in CI (``CI`` set) it
fails them, so crash-safety evidence can never silently disappear."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path

import pytest

from agent_worker.agent import Registry
from agent_worker.core.clock import ManualClock
from tests.support import (
    ROOT,
    Fleet,
    client_on,
    drop_database,
    lock_redis_db,
    logs,
    unavailable,
    worker_environ,
)

PG_ADMIN = os.environ.get("AGENT_WORKER_TEST_PG", "postgresql+psycopg://agent_worker@127.0.0.1:54329/agent_worker")
REDIS = os.environ.get("AGENT_WORKER_TEST_REDIS", "redis://127.0.0.1:63799")


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
            unavailable(f"could not start local services: {done.stderr[-500:]}")


@pytest.fixture(scope="session")
def database_template(services: None) -> Iterator[str]:
    """The name of a migrated database with the test clock that nobody
    connects to: ``CREATE DATABASE ... TEMPLATE`` copies it in about 20 ms,
    against 200 ms to migrate a new one."""
    from agent_worker.store.migrate import upgrade

    with ExitStack() as stack:
        try:
            url = stack.enter_context(new_database("aw_tpl"))
        except Exception as e:
            unavailable(f"postgres not reachable at {PG_ADMIN}: {e}")
        upgrade(url)
        _install_test_clock(url)
        yield url.rsplit("/", 1)[1]


@pytest.fixture(scope="session")
def database_url(database_template: str) -> Iterator[str]:
    """The test session's database, shared by its tests: look for your own
    rows, never for exactly yours."""
    with new_database("aw_test", template=database_template) as url:
        yield url


@pytest.fixture
def own_database_url(database_template: str) -> Iterator[str]:
    """A database of the test's own, for a verb that reads the whole
    database: the sweep picks at most ``limit`` due runs a pass, so in the
    session's database the runs earlier tests left could crowd out the
    test's own (as a real backlog would, until a later pass)."""
    with new_database("aw_own", template=database_template) as url:
        yield url


@contextmanager
def new_database(prefix: str, template: str | None = None) -> Iterator[str]:
    """The URL of a new database named ``prefix_…`` on the test server, dropped
    afterwards: empty, or a copy of ``template`` with the test clock first on
    its search_path (a database's settings are not copied from its template)."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            if template is None:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            else:
                c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
                c.execute(text(f'ALTER DATABASE "{name}" SET search_path = {TEST_SEARCH_PATH}'))
        try:
            yield _url_of(name)
        finally:
            drop_database(admin, name)
    finally:
        admin.dispose()


def _url_of(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + database


#: ``testclock.now()`` before ``pg_catalog.now()`` (``_install_test_clock``).
TEST_SEARCH_PATH = '"$user", public, testclock, pg_catalog'


def _install_test_clock(url: str) -> None:
    """Give the test database a clock tests can move: every lease, timer and
    timeout is compared on the database's ``now()`` (store.dbtime), so moving
    worker clocks no longer fires a timer. A ``now()`` that adds
    ``testclock.shift`` (to the real time, or to the instant it is frozen at)
    comes before ``pg_catalog`` on the database's search_path; production
    databases have no such schema."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text("CREATE SCHEMA testclock"))
        c.execute(text("CREATE TABLE testclock.shift (seconds double precision NOT NULL, "
                       "frozen_at timestamptz)"))
        c.execute(text("INSERT INTO testclock.shift VALUES (0, NULL)"))
        c.execute(text(
            "CREATE FUNCTION testclock.now() RETURNS timestamptz LANGUAGE sql STABLE AS "
            "$$ SELECT coalesce(frozen_at, pg_catalog.now()) + make_interval(secs => seconds) "
            "FROM testclock.shift $$"))
    engine.dispose()


class DatabaseClock:
    """Moves the test database's time (and so every lease, timer and timeout),
    or stops it (``freeze``)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")

    def advance(self, **delta: float) -> None:
        from datetime import timedelta

        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("UPDATE testclock.shift SET seconds = seconds + :s"),
                      {"s": timedelta(**delta).total_seconds()})

    def freeze(self, at: datetime) -> None:
        """Stop the database's time at ``at``: from now on it moves only by
        ``advance``, like a ``ManualClock`` (``LockstepClock``), so what the
        database stamps (a sweep's timeout, an escalation's deadline) equals
        what a test computes from that clock, to the microsecond."""
        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("UPDATE testclock.shift SET seconds = 0, frozen_at = :at"),
                      {"at": at})

    def reset(self) -> None:
        from sqlalchemy import text

        with self.engine.connect() as c:
            c.execute(text("UPDATE testclock.shift SET seconds = 0, frozen_at = NULL"))
        self.engine.dispose()


class LockstepClock(ManualClock):
    """A worker's ``ManualClock`` the test database's clock follows: frozen at
    the same start and moved by the same amounts. On Postgres the sweeper and
    the claim compare on the database's time and the lap stamps the worker's;
    in lockstep the two agree exactly, as the one clock of SQLite does."""

    def __init__(self, start: datetime, database: DatabaseClock) -> None:
        super().__init__(start)
        self.database = database
        database.freeze(start)

    def advance(self, **delta: float) -> datetime:
        self.database.advance(**delta)
        return super().advance(**delta)


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
        unavailable(f"redis not reachable at {url}: {e}")
    yield url
    lock.close()


@pytest.fixture
def worker_env(database_url: str, broker_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for worker, beat and CLI subprocesses (``worker_environ``)."""
    return worker_environ(database_url, broker_url, tmp_path / "faults")


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
    yield from client_on(worker_env, monkeypatch)
