"""``deploy/local/services.sh`` runs Postgres without trust:
scram-sha-256 over TCP, a generated password kept for its owner only and given
to libpq through the passfile, and an app role that owns its database and may
create test databases but is not a superuser (``COPY ... TO PROGRAM`` refused).
A data folder left by the older script (trust, superuser) is migrated at start.

Runs the script from a copy on ports of its own, with a private passfile, so
the machine's shared services and ``~/.pgpass`` are untouched."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Checkout:
    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "agent-worker"
        for rel in ("deploy/local/services.sh", "deploy/redis/redis.conf",
                    "deploy/k8s/postgres-roles.sql"):
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, self.root / rel)
        self.passfile = tmp / "pgpass"
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in {"AGENT_WORKER_DATA_DIR", "PGPASSFILE", "PGPASSWORD"}}
        self.env.update(PG_PORT=str(self.port), REDIS_PORT=str(free_port()),
                        VENDOR_PORT=str(free_port()), PGPASSFILE=str(self.passfile))
        self.moved: list[str] = []

    def run(self, verb: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.root / "deploy/local/services.sh"), verb],
                              env=self.env, capture_output=True, text=True, timeout=180,
                              check=False)
        self.moved += [line.split()[3] for line in done.stdout.splitlines()
                       if line.startswith("postgres: data in ")]
        return done

    def pg_dir(self) -> Path:
        return Path(self.moved[0]) if self.moved else self.root / ".data/pg"

    def connect(self, *, password: str | None = None, passfile: str | None = None,
                user: str = "agent_worker", dbname: str = "agent_worker") -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user=user, dbname=dbname,
                               password=password, passfile=passfile or str(self.passfile),
                               autocommit=True, connect_timeout=10)

    def as_postgres(self, sql: str) -> None:
        """What the older script left: run as the superuser over the socket."""
        psql = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                   check=True).stdout.strip()) / "psql"
        argv = [str(psql), "-h", "/tmp", "-p", str(self.port), "-U", "postgres", "-d",
                "postgres", "-qtA", "-v", "ON_ERROR_STOP=1", "-c", sql]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def checkout(tmp_path: Path) -> Iterator[Checkout]:
    if shutil.which("pg_config") is None and not list(Path("/usr/lib/postgresql").glob("*")):
        pytest.skip("Postgres binaries not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("root without runuser")
    co = Checkout(tmp_path)
    try:
        yield co
    finally:
        co.run("stop")
        for pg in co.moved:
            shutil.rmtree(Path(pg).parent, ignore_errors=True)


def test_scram_a_private_password_and_an_app_role_that_is_not_superuser(
        checkout: Checkout) -> None:
    started = checkout.run("start")
    assert started.returncode == 0, started.stdout + started.stderr
    password_file = checkout.root / ".data/pg-password"
    password = password_file.read_text().strip()
    assert len(password) >= 20 and (password_file.stat().st_mode & 0o777) == 0o600
    assert (checkout.passfile.stat().st_mode & 0o777) == 0o600
    assert f"127.0.0.1:{checkout.port}:*:agent_worker:{password}" in checkout.passfile.read_text()
    assert password not in started.stdout + started.stderr, "the password leaked into the output"
    assert f"postgresql+psycopg://agent_worker@127.0.0.1:{checkout.port}/agent_worker" in \
        started.stdout

    hba = (checkout.pg_dir() / "pg_hba.conf").read_text() if os.access(
        checkout.pg_dir() / "pg_hba.conf", os.R_OK) else ""
    assert "trust" not in hba.replace("no trust anywhere", "")

    with checkout.connect() as conn:
        row = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles "
                           "WHERE rolname = current_user").fetchone()
        assert row == (False, True, False)
        # The deploy paths' three roles: the schema's owner, not the app role,
        # owns the database (the app role may not create a table in it).
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database "
                             "WHERE datname = 'agent_worker'").fetchone()
        assert owner == ("agent_worker_owner",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        # What the test fixtures do: a database per session, owned by the app role.
        conn.execute('CREATE DATABASE "aw_auth_check"')

    # The migrations run as the app role, in a database it created.
    env = {**checkout.env, "PYTHONPATH": str(ROOT)}
    url = f"postgresql+psycopg://agent_worker@127.0.0.1:{checkout.port}/aw_auth_check"
    migrated = subprocess.run(["python", "-c", f"from agent_worker.store.migrate import upgrade; "
                                               f"upgrade({url!r})"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)
    assert migrated.returncode == 0, migrated.stderr[-2000:]

    # The workers' system role: passes row-level security, holds the app role's
    # privileges on its tables, and is no superuser either.
    system_password = (checkout.root / ".data/pg-system-password").read_text().strip()
    assert f"127.0.0.1:{checkout.port}:*:agent_worker_system:{system_password}" in \
        checkout.passfile.read_text()
    with checkout.connect(user="agent_worker_system", dbname="aw_auth_check") as conn:
        assert conn.execute("SELECT rolsuper, rolbypassrls FROM pg_roles "
                            "WHERE rolname = current_user").fetchone() == (False, True)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")

    # The schema's owner migrates the local database (demo.sh does the same);
    # the app role then has its DML there, and no DDL.
    owner_password = (checkout.root / ".data/pg-owner-password").read_text().strip()
    assert f"127.0.0.1:{checkout.port}:*:agent_worker_owner:{owner_password}" in \
        checkout.passfile.read_text()
    url = f"postgresql+psycopg://agent_worker_owner@127.0.0.1:{checkout.port}/agent_worker"
    migrated = subprocess.run(["python", "-c", f"from agent_worker.store.migrate import upgrade; "
                                               f"upgrade({url!r})"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    with checkout.connect() as conn:
        conn.execute("SELECT set_config('agent_worker.tenant', '*', false)")
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("ALTER TABLE runs NO FORCE ROW LEVEL SECURITY")

    # Scram, not trust: no password, or a wrong one, is refused.
    empty = checkout.passfile.parent / "empty-pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    with pytest.raises(psycopg.OperationalError, match="password"):
        checkout.connect(passfile=str(empty))
    with pytest.raises(psycopg.OperationalError, match="password"):
        checkout.connect(password="CHANGE_ME", passfile=str(empty))


def test_a_data_folder_of_the_older_script_is_migrated(checkout: Checkout) -> None:
    first = checkout.run("start")
    assert first.returncode == 0, first.stdout + first.stderr
    # Put the folder back the way the older script left it: trust, superuser,
    # the app role owning the database and its tables.
    pg = checkout.pg_dir()
    checkout.as_postgres("ALTER ROLE agent_worker SUPERUSER PASSWORD NULL")
    checkout.as_postgres("ALTER DATABASE agent_worker OWNER TO agent_worker")
    trust = "local all all trust\nhost all all 127.0.0.1/32 trust\n"
    subprocess.run(["sh", "-c", f"printf '{trust}' > {pg}/pg_hba.conf"], check=True)
    checkout.as_postgres("SELECT pg_reload_conf()")
    (checkout.root / ".data/pg-password").unlink()
    checkout.passfile.unlink()
    with checkout.connect(passfile=str(checkout.passfile)) as conn:  # trust: no password
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                            ).fetchone() == (True,)
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")

    again = checkout.run("start")
    assert again.returncode == 0, again.stdout + again.stderr
    with checkout.connect() as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (42,), "data kept"
        # Handed to the schema's owner: the app role keeps its DML, not the table.
        assert conn.execute("SELECT pg_get_userbyid(relowner) FROM pg_class "
                            "WHERE relname = 'kept'").fetchone() == ("agent_worker_owner",)
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                            ).fetchone() == (False,)
    empty = checkout.passfile.parent / "empty-pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    with pytest.raises(psycopg.OperationalError, match="password"):
        checkout.connect(passfile=str(empty))
