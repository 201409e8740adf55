"""The three database roles, as every deploy path creates them: the init SQL
that docker-compose.yml and the Kubernetes StatefulSet mount into the Postgres
image's ``/docker-entrypoint-initdb.d`` (and ``deploy/local/services.sh`` runs)
is replayed against a throwaway Postgres of this test's own, the migrations run
as the owner, as the compose ``migrate`` service and the migrate Job do, and
each role can do what the docs say and nothing more: the app role its DML but
no ALTER, no policy change, no DELETE of an audit entry; the system role every
tenant's rows; the owner the schema.

The throwaway cluster (initdb, a few seconds) leaves the shared services alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml

from agent_worker.agent import Agent, register
from agent_worker.core.errors import PermissionDeniedError
from agent_worker.core.principal import Principal
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel
from agent_worker.store.migrate import upgrade
from tests.support import ROOT

pytestmark = pytest.mark.integration

ROLES_SQL = ROOT / "deploy/k8s/postgres-roles.sql"
PASSWORDS = {"AGENT_WORKER_OWNER_PASSWORD": "owner-pw-1", "AGENT_WORKER_APP_PASSWORD": "app-pw-1",
             "AGENT_WORKER_SYSTEM_PASSWORD": "system-pw-1"}
ROLE_PASSWORDS = {"agent_worker_owner": "owner-pw-1", "agent_worker": "app-pw-1",
                  "agent_worker_system": "system-pw-1"}
INITDB_DIR = "/docker-entrypoint-initdb.d"

register(Agent(name="roles-echo", model=lambda: ScriptedModel.by_lap([], final="done")))


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found is None:
        pytest.skip("Postgres binaries not installed (pg_config)")
    return Path(subprocess.run([found, "--bindir"], capture_output=True, text=True,
                               check=True).stdout.strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A private Postgres: the superuser over its own socket, every role over TCP
    with its password (scram-sha-256, as in the images)."""

    bindir: Path
    data: Path
    port: int

    def as_pg(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def psql(self, database: str, *, file: Path | None = None, sql: str | None = None,
             user: str = "postgres", env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
        """As the image's entrypoint runs an init file: psql, ON_ERROR_STOP, the
        superuser, the database POSTGRES_DB names, the container's environment."""
        argv = [str(self.bindir / "psql"), "-h", str(self.data), "-p", str(self.port), "-U", user,
                "-d", database, "-v", "ON_ERROR_STOP=1", "-qtA"]
        argv += ["-f", str(file)] if file else ["-c", sql or ""]
        return subprocess.run(self.as_pg("env", *[f"{k}={v}" for k, v in (env or {}).items()],
                                         *argv), capture_output=True, text=True, timeout=60,
                              check=False)

    def url(self, role: str, database: str) -> str:
        return (f"postgresql+psycopg://{role}:{ROLE_PASSWORDS[role]}@127.0.0.1:{self.port}/"
                f"{database}")

    def connect(self, role: str, database: str) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user=role, dbname=database,
                               password=ROLE_PASSWORDS[role], autocommit=True,
                               connect_timeout=10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("root without runuser")
    bindir = _bindir()
    # Not under pytest's temporary folder: as root, that is mode 700, and the
    # server runs as the postgres user.
    data = Path(tempfile.mkdtemp(prefix="agent-worker-roles-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
    c = Cluster(bindir, data, _free_port())
    try:
        subprocess.run(c.as_pg(str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                               "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8"),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(c.as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-l",
                               str(data / "log"), "-w", "-t", "60", "-o",
                               f"-p {c.port} -k {data} -c listen_addresses=127.0.0.1 "
                               "-c fsync=off", "start"),
                       check=True, capture_output=True, timeout=120)
        yield c
    finally:
        subprocess.run(c.as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                               "stop"), capture_output=True, timeout=60, check=False)
        shutil.rmtree(data, ignore_errors=True)


def _deployed(cluster: Cluster, database: str) -> None:
    """What ``docker compose up`` or the StatefulSet's first start does: the image
    creates POSTGRES_DB as the superuser, runs the init file in it; then the
    migrate step runs ``agent-worker db upgrade`` as the owner."""
    assert cluster.psql("postgres", sql=f"CREATE DATABASE {database}").returncode == 0
    done = cluster.psql(database, file=ROLES_SQL, env=PASSWORDS)
    assert done.returncode == 0, done.stderr
    upgrade(cluster.url("agent_worker_owner", database))


def _refused(conn: psycopg.Connection, sql: str) -> str:
    with pytest.raises(psycopg.Error) as e:
        conn.execute(sql)
    return str(e.value)


def test_compose_and_kubernetes_run_the_one_init_file_in_the_image_init_folder() -> None:
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    pg = compose["services"]["postgres"]
    assert f"./k8s/postgres-roles.sql:{INITDB_DIR}/10-agent-worker-roles.sql:ro" in pg["volumes"]
    assert pg["environment"]["POSTGRES_USER"] == "postgres"
    assert set(PASSWORDS) <= set(pg["environment"])
    kustomization = yaml.safe_load((ROOT / "deploy/k8s/kustomization.yaml").read_text())
    generated = {g["name"]: g for g in kustomization["configMapGenerator"]}
    assert generated["agent-worker-postgres-init"]["files"] == [
        "10-agent-worker-roles.sql=postgres-roles.sql"]
    manifest = (ROOT / "deploy/k8s/postgres-statefulset.yaml").read_text()
    sts = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["init"]["mountPath"] == INITDB_DIR
    assert volumes["init"]["configMap"]["name"] == "agent-worker-postgres-init"
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert set(PASSWORDS) <= env


def test_the_app_role_has_its_dml_and_cannot_alter_drop_or_rewrite(cluster: Cluster) -> None:
    _deployed(cluster, "fresh")
    with cluster.connect("agent_worker", "fresh") as app:
        app.execute("SELECT set_config('agent_worker.tenant', 'acme', false)")
        app.execute("INSERT INTO audit_log (at, tenant, principal, action, outcome) "
                    "VALUES (now(), 'acme', 'alice', 'start', 'ok')")
        assert app.execute("SELECT count(*) FROM audit_log").fetchone() == (1,)
        app.execute("UPDATE share_limits SET weight = 1 WHERE false")
        app.execute("DELETE FROM rate_charges WHERE false")
        for sql in ("ALTER TABLE runs ADD COLUMN x int",
                    "ALTER TABLE runs NO FORCE ROW LEVEL SECURITY",
                    "ALTER TABLE runs DISABLE ROW LEVEL SECURITY",
                    "DROP POLICY tenant_scope ON runs",
                    "ALTER TABLE audit_log DISABLE TRIGGER USER",
                    "DROP TABLE audit_log", "CREATE TABLE mine (x int)",
                    "CREATE OR REPLACE FUNCTION audit_log_retention() RETURNS interval "
                    "LANGUAGE sql AS $$ SELECT interval '1 second' $$"):
            why = _refused(app, sql)
            assert "must be owner" in why or "permission denied" in why, sql
        # The audit log: no DELETE, UPDATE or TRUNCATE privilege at all (not
        # only the trigger's refusal), whatever setting the caller chooses.
        app.execute("SELECT set_config('agent_worker.audit_prune_before', '2999-01-01', false)")
        for sql in ("DELETE FROM audit_log", "UPDATE audit_log SET principal = 'eve'",
                    "TRUNCATE audit_log"):
            assert "permission denied for table audit_log" in _refused(app, sql), sql
        assert app.execute("SELECT audit_log_prune(now()::timestamp, 10)").fetchone() == (0,)
        assert app.execute("SELECT count(*) FROM audit_log").fetchone() == (1,)
        assert app.execute("SELECT rolsuper OR rolbypassrls OR rolcreatedb OR rolcreaterole "
                           "FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)


def test_the_system_role_sees_every_tenant_and_cannot_alter(cluster: Cluster) -> None:
    _deployed(cluster, "system")
    with cluster.connect("agent_worker", "system") as app:
        for tenant in ("acme", "globex"):
            app.execute("SELECT set_config('agent_worker.tenant', %s, false)", (tenant,))
            app.execute("INSERT INTO rate_charges (run_id, lap, tenant, at, tokens) "
                        "VALUES (%s, 1, %s, now(), 0)", (f"{tenant}-1", tenant))
    with cluster.connect("agent_worker_system", "system") as system:
        # No tenant setting: BYPASSRLS reads (and writes) every tenant's rows.
        assert system.execute("SELECT count(DISTINCT tenant) FROM rate_charges"
                              ).fetchone() == (2,)
        system.execute("DELETE FROM rate_charges WHERE tenant = 'globex'")
        system.execute("SELECT audit_log_prune(now()::timestamp, 10)")
        assert "must be owner" in _refused(system, "ALTER TABLE runs ADD COLUMN x int")
        assert "permission denied" in _refused(system, "DELETE FROM audit_log")


def test_a_run_started_as_the_app_role_runs_its_laps_as_the_system_role(
        cluster: Cluster) -> None:
    """The processes as deployed: a tenant's principal starts a run through
    the app role; a worker and its sweeper, as the system role, run it."""
    _deployed(cluster, "laps")
    app = InProcessWorker(cluster.url("agent_worker", "laps"))  # at head: migrates nothing
    fleet = InProcessWorker(cluster.url("agent_worker_system", "laps"))
    try:
        alice = app.acting_as(Principal("alice", "acme", {"submitter"}))
        run = alice.start_run("roles-echo", {"n": 1})
        fleet.queue.pending.extend(app.queue.pending)  # the broker between the two
        app.queue.pending.clear()
        assert fleet.run_until_idle() >= 1
        assert alice.get_run(run.id).status == "succeeded"
        assert alice.list_runs() and not app.acting_as(
            Principal("eve", "globex", {"submitter"})).list_runs()
    finally:
        app.close()
        fleet.close()


def test_a_tenants_principal_sees_its_own_queues_and_limits_through_the_app_role(
        cluster: Cluster) -> None:
    """The fleet views (tests/integration/test_fleet_views.py) through the app
    role as deployed: queued runs and limits of two tenants, one tenant's view."""
    _deployed(cluster, "views")
    app = InProcessWorker(cluster.url("agent_worker", "views"))
    try:
        admin = app.acting_as(Principal("root", "*", {"admin"}))
        for tenant in ("acme", "globex"):
            admin.start_run("roles-echo", {"n": 1}, tenant=tenant)
            admin.set_share(tenant, concurrency=2)
        ops = app.acting_as(Principal("acme:ops", "acme", {"operator"}))
        assert {q.tenant for q in admin.queues()} == {"acme", "globex"}
        assert {q.tenant for q in ops.queues()} == {"acme"}
        assert {r.tenant for r in ops.share_limits()} == {"acme"}
        with pytest.raises(PermissionDeniedError):
            app.acting_as(Principal("acme:nobody", "acme", ())).queues()
    finally:
        app.close()


def test_tables_of_later_migrations_reach_the_app_role_and_the_owner_migrates(
        cluster: Cluster) -> None:
    _deployed(cluster, "later")
    with cluster.connect("agent_worker_owner", "later") as owner:
        owner.execute("CREATE TABLE a_later_table (id bigserial PRIMARY KEY, x int)")
        upgrade(cluster.url("agent_worker_owner", "later"))  # again: nothing to do
    with cluster.connect("agent_worker", "later") as app:
        app.execute("INSERT INTO a_later_table (x) VALUES (1)")
        assert app.execute("SELECT x FROM a_later_table").fetchone() == (1,)


def test_an_older_install_is_handed_to_the_owner_by_running_the_file_again(
        cluster: Cluster) -> None:
    """An install of an older release: the app role created and owns every table."""
    cluster.psql("postgres", sql="SET password_encryption = 'scram-sha-256'; "
                 "CREATE ROLE agent_worker LOGIN PASSWORD 'app-pw-1'")  # unless an earlier test did
    assert cluster.psql("postgres", sql="CREATE DATABASE older OWNER agent_worker"
                        ).returncode == 0
    assert cluster.psql("older", sql="GRANT CREATE ON SCHEMA public TO agent_worker"
                        ).returncode == 0
    upgrade(cluster.url("agent_worker", "older"))
    done = cluster.psql("older", file=ROLES_SQL, env=PASSWORDS)
    assert done.returncode == 0, done.stderr
    owned = cluster.psql("older", sql="SELECT count(*) FROM pg_class c JOIN pg_namespace n "
                         "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND "
                         "pg_get_userbyid(c.relowner) = 'agent_worker'")
    assert owned.stdout.strip() == "0"
    with cluster.connect("agent_worker", "older") as app:
        assert "must be owner" in _refused(app, "ALTER TABLE runs NO FORCE ROW LEVEL SECURITY")
        assert "permission denied" in _refused(app, "DELETE FROM audit_log")
        app.execute("SELECT set_config('agent_worker.tenant', 'acme', false)")
        assert app.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    upgrade(cluster.url("agent_worker_owner", "older"))


def test_the_file_refuses_to_run_without_its_passwords_or_as_the_app_role(
        cluster: Cluster) -> None:
    cluster.psql("postgres", sql="CREATE DATABASE refusals")
    done = cluster.psql("refusals", file=ROLES_SQL, env={})
    assert done.returncode != 0 and "AGENT_WORKER_*_PASSWORD" in done.stderr
    cluster.psql("postgres", sql="CREATE ROLE old_superuser SUPERUSER LOGIN")
    done = cluster.psql("refusals", file=ROLES_SQL, env=PASSWORDS, user="old_superuser")
    assert done.returncode == 0, done.stderr
    cluster.psql("postgres", sql="ALTER ROLE agent_worker SUPERUSER")
    done = cluster.psql("refusals", file=ROLES_SQL, env=PASSWORDS, user="agent_worker")
    assert done.returncode != 0 and "another superuser" in done.stderr
    cluster.psql("postgres", sql="ALTER ROLE agent_worker NOSUPERUSER")
