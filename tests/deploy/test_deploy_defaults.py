"""Safe deploy defaults: Flower and the metrics endpoint bind
loopback unless told otherwise, the demo's Flower password is random, and a
placeholder password stops a process at start instead of guarding it."""

from __future__ import annotations

import configparser
import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_worker.core.errors import AgentWorkerError, PlaceholderSecretError
from agent_worker.core.settings import Settings
from agent_worker.deploy_checks import check_deploy_secrets, is_placeholder, url_password
from tests.support import ROOT
from tests.support_docs import read_docs

DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
STRONG = "db:Xk3-9qWv_Lr7"


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser


def _run_check(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The unit's ExecStartPre as systemd runs it ($$ is a literal $), with our
    interpreter in place of the unit's venv."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("AGENT_WORKER_") and k != "FLOWER_BASIC_AUTH"}
    argv = [sys.executable if a == "/opt/agent-worker/venv/bin/python" else a
            for a in shlex.split(command.replace("$$", "$"))]
    argv = [a.replace("/opt/agent-worker/venv/bin/python", sys.executable) for a in argv]
    return subprocess.run(argv, cwd=ROOT,
                          env={**base, "PYTHONPATH": str(ROOT), **env}, capture_output=True,
                          text=True, timeout=60, check=False)


# --------------------------------------------------------------------------- placeholders


@pytest.mark.parametrize("password", ["CHANGE_ME", "changeme", "password", "demo", "",
                                      "Change_Me_Please", " secret "])
def test_placeholder_passwords_are_recognised(password: str) -> None:
    assert is_placeholder(password)


def test_real_passwords_pass_and_urls_without_one_are_not_checked() -> None:
    assert not is_placeholder("Xk3-9qWv_Lr7") and not is_placeholder("s3cret-pass")
    assert url_password("postgresql+psycopg://app@127.0.0.1:54329/app") is None
    assert url_password("redis://:p%40ss@redis:6379/0") == "p@ss"
    assert url_password("postgresql://app:@db/app") == ""


@pytest.mark.parametrize(("field", "value"), [
    ("database_url", "postgresql+psycopg://agent_worker:CHANGE_ME@db:5432/agent_worker"),
    ("database_url", "postgresql+psycopg://agent_worker:@db:5432/agent_worker"),
    ("broker_url", "redis://agent-worker:changeme@redis:6379/0"),
    ("system_database_url", "postgresql+psycopg://agent_worker_system:CHANGE_ME@db/aw"),
])
def test_a_placeholder_in_a_url_is_refused(field: str, value: str) -> None:
    with pytest.raises(PlaceholderSecretError, match=field.upper()) as caught:
        check_deploy_secrets(Settings(**{field: value}), {})  # type: ignore[arg-type]
    assert isinstance(caught.value, AgentWorkerError)
    assert caught.value.code == "placeholder_secret"


@pytest.mark.parametrize("auth", ["admin:CHANGE_ME", "ops:s3cret-pass,demo:demo", "admin:",
                                  "admin"])
def test_a_placeholder_flower_password_is_refused(auth: str) -> None:
    with pytest.raises(PlaceholderSecretError, match="FLOWER_BASIC_AUTH"):
        check_deploy_secrets(Settings(), {"FLOWER_BASIC_AUTH": auth})
    check_deploy_secrets(Settings(), {"FLOWER_BASIC_AUTH": "ops:s3cret-pass"})


def test_the_celery_app_refuses_to_load_with_a_placeholder() -> None:
    """Worker, beat and Flower all load ``tasks.app`` (``celery -A agent_worker.tasks``): none
    starts on CHANGE_ME. Importing ``tasks`` alone builds nothing (it is lazy)."""
    base = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    done = subprocess.run([sys.executable, "-c", "import agent_worker.tasks as t; t.app"], cwd=ROOT,
                          env={**base, "PYTHONPATH": str(ROOT),
                               "FLOWER_BASIC_AUTH": "admin:CHANGE_ME"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "PlaceholderSecretError" in done.stderr and "FLOWER_BASIC_AUTH" in done.stderr


def test_the_systemd_flower_unit_refuses_the_example_password() -> None:
    pre = [line.split("=", 1)[1] for line in
           (SYSTEMD / "agent-worker-flower.service").read_text().splitlines()
           if line.startswith("ExecStartPre=")]
    check = next(cmd for cmd in pre if "deploy_checks" in cmd)
    example = dict(line.split("=", 1) for line in
                   (SYSTEMD / "agent-worker.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    refused = _run_check(check, {k: v for k, v in example.items()
                          if k.startswith(("AGENT_WORKER_", "FLOWER_"))})
    assert refused.returncode == 1, refused.stderr
    assert "refusing to start" in refused.stderr and "Traceback" not in refused.stderr
    fixed = {**example, "FLOWER_BASIC_AUTH": "admin:Xk3-9qWv_Lr7",
             "AGENT_WORKER_DATABASE_URL": f"postgresql+psycopg://{STRONG}@db.internal/aw",
             "AGENT_WORKER_SYSTEM_DATABASE_URL": f"postgresql+psycopg://{STRONG}@db.internal/aw"}
    ok = _run_check(check, {k: v for k, v in fixed.items() if k.startswith(("AGENT_WORKER_",
                                                                       "FLOWER_"))})
    assert ok.returncode == 0, ok.stderr


# --------------------------------------------------------------------------- bind addresses


def test_metrics_binds_loopback_by_default() -> None:
    assert Settings().metrics_bind == "127.0.0.1"
    unit = _unit("agent-worker-metrics.service")
    assert "--addr ${AGENT_WORKER_METRICS_BIND}" in unit.get("Service", "ExecStart")
    envs = (SYSTEMD / "agent-worker-metrics.service").read_text()
    assert "Environment=AGENT_WORKER_METRICS_BIND=127.0.0.1" in envs


def test_flower_binds_loopback_wherever_it_runs_on_a_host() -> None:
    flower_unit = (SYSTEMD / "agent-worker-flower.service").read_text()
    assert "Environment=FLOWER_ADDRESS=127.0.0.1" in flower_unit
    assert "--address=${FLOWER_ADDRESS}" in _unit("agent-worker-flower.service").get(
        "Service", "ExecStart")
    procfile = dict(line.split(": ", 1) for line in (DEPLOY / "Procfile").read_text()
                    .splitlines() if line and not line.startswith("#"))
    assert "--address=${FLOWER_ADDRESS:-127.0.0.1}" in procfile["flower"]
    assert "--addr" not in procfile["metrics"], "the setting's loopback default applies"
    docs = read_docs()  # README.md and the documentation site (docs/guides/fleet.md)
    assert "celery -A agent_worker.tasks flower --port=5555 --address=127.0.0.1" in docs
    demo = (ROOT / "agent_worker/demo/orchestrate.py").read_text()
    assert '"--address=127.0.0.1"' in demo


def test_containers_listen_inside_but_publish_on_loopback() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    assert "--address=0.0.0.0" in compose["flower"]["command"]
    assert compose["metrics"]["command"][-2:] == ["--addr", "0.0.0.0"]
    for name, port in (("flower", "5555"), ("metrics", "9100")):
        published = compose[name]["ports"]
        assert all(re.match(r"\$\{\w+:-127\.0\.0\.1:" + port + r"\}:" + port, p)
                   for p in published), published


# --------------------------------------------------------------------------- demo password


def test_the_demo_password_is_random_and_saved_for_its_owner_only(tmp_path: Path) -> None:
    from agent_worker.demo import orchestrate

    source = Path(orchestrate.__file__).read_text()
    assert "demo:demo" not in source
    path = tmp_path / "flower-auth"
    orchestrate._save_auth(path, "demo:abc")
    assert path.read_text() == "demo:abc" and (path.stat().st_mode & 0o777) == 0o600


def test_the_demo_console_login_is_the_printed_random_password_stored_only_hashed() -> None:
    """demo.sh prints a generated console password; the console gets its hash only,
    and the demo user sees every tenant and may decide the goodwill run it left."""
    from agent_worker.console.users import UserBook
    from agent_worker.demo import goodwill, orchestrate

    env = orchestrate._console_env("pw-4f9-printed", "http://127.0.0.1:5555")
    users = env["AGENT_WORKER_CONSOLE_USERS"]
    assert "pw-4f9-printed" not in users
    book = UserBook.parse(users)
    user = book.login(orchestrate.CONSOLE_USER, "pw-4f9-printed")
    assert user is not None and user.principal.all_tenants
    assert user.principal.member_of(goodwill.OWNER)
    assert book.login(orchestrate.CONSOLE_USER, "demo") is None


# --------------------------------------------------------------------------- kubernetes

K8S = DEPLOY / "k8s"


@functools.cache
def _k8s_docs() -> tuple[dict[str, Any], ...]:
    return tuple(d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
                 if d)


def _k8s(kind: str) -> list[dict[str, Any]]:
    return [d for d in _k8s_docs() if d.get("kind") == kind]


def _templates() -> dict[str, dict[str, Any]]:
    """Pod templates by component: worker, beat, flower, metrics, migrate, redis, postgres."""
    found = {}
    for kind in ("Deployment", "StatefulSet", "Job"):
        for obj in _k8s(kind):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            found[labels["app.kubernetes.io/component"]] = obj["spec"]["template"]
    return found


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] != "In" or labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _policy(component: str) -> dict[str, Any]:
    labels = _templates()[component]["metadata"]["labels"]
    found = [p for p in _k8s("NetworkPolicy")
             if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)]
    assert len(found) == 1, f"{component}: {len(found)} NetworkPolicies select it"
    return found[0]


def _admitted(policy: dict[str, Any]) -> set[str]:
    """Components of ours whose pods the policy's ingress rules admit."""
    return {name for name, t in _templates().items()
            for rule in policy["spec"]["ingress"] for peer in rule["from"]
            if "podSelector" in peer and "namespaceSelector" not in peer
            and _selects(peer["podSelector"], t["metadata"]["labels"])}


def test_the_namespace_denies_ingress_by_default() -> None:
    assert "networkpolicy.yaml" in (K8S / "kustomization.yaml").read_text()
    deny = [p for p in _k8s("NetworkPolicy") if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1 and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny[0]["spec"], "default deny admits nobody"


def test_only_workers_beat_and_flower_reach_redis() -> None:
    policy = _policy("redis")
    assert _admitted(policy) == {"worker", "beat", "flower"}
    assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [6379]
    # Besides those, only pods the operator labels as producers: no namespaceSelector.
    peers = [peer for r in policy["spec"]["ingress"] for peer in r["from"]]
    assert all(set(peer) == {"podSelector"} for peer in peers), peers


def test_only_the_app_pods_reach_postgres() -> None:
    policy = _policy("postgres")
    assert _admitted(policy) == {"worker", "beat", "flower", "metrics", "migrate"}
    assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [5432]


@pytest.mark.parametrize(("component", "port"), [("flower", 5555), ("metrics", 9100)])
def test_flower_and_metrics_admit_only_their_port(component: str, port: int) -> None:
    policy = _policy(component)
    assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [port]
    services = [s for s in _k8s("Service")
                if s["spec"]["selector"].items()
                <= _templates()[component]["metadata"]["labels"].items()]
    assert services and all(s["spec"].get("type", "ClusterIP") == "ClusterIP"
                            for s in services), "never published outside the cluster"


def test_the_broker_url_carries_the_fleet_users_password_from_the_secret() -> None:
    (configmap,) = _k8s("ConfigMap")
    assert "AGENT_WORKER_BROKER_URL" not in configmap["data"], "a password in a ConfigMap"
    (secret,) = _k8s("Secret")
    url = secret["stringData"]["AGENT_WORKER_BROKER_URL"]
    assert url.startswith("redis://agent-worker:") and "@agent-worker-redis:6379" in url
    assert url_password(url) == secret["stringData"]["REDIS_PASSWORD"] == "CHANGE_ME"
    for name in ("worker", "beat", "flower"):
        (container,) = _templates()[name]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["AGENT_WORKER_BROKER_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "agent-worker", "key": "AGENT_WORKER_BROKER_URL"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_manifests_redis_refuses_anonymous_clients_and_serves_the_fleet(
        tmp_path: Path) -> None:
    """The Redis container's own start command, run here: the default user is
    off, the fleet's ACL user publishes and consumes, FLUSHALL is refused."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server not installed")
    (container,) = _templates()["redis"]["spec"]["containers"]
    script = container["command"][2].replace("/run/redis", str(tmp_path))
    port = _free_port()
    password = "Xk3-9qWv_Lr7"
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--appendonly", "no", "--save", ""]
    proc = subprocess.Popen(["sh", "-c", script, "redis-server", *args],
                            env={**os.environ, "REDIS_PASSWORD": password},
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        def cli(*argv: str, auth: bool = True) -> str:
            env = {**os.environ, **({"REDISCLI_AUTH": password} if auth else {})}
            user = ["--user", "agent-worker"] if auth else []
            return subprocess.run(["redis-cli", "-p", str(port), *user, *argv], env=env,
                                  capture_output=True, text=True, timeout=10).stdout.strip()

        deadline = time.monotonic() + 20
        while cli("ping") != "PONG" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cli("ping") == "PONG"
        assert "NOAUTH" in cli("ping", auth=False) or "NOPERM" in cli("ping", auth=False)
        assert (tmp_path / "users.acl").stat().st_mode & 0o077 == 0
        assert "NOPERM" in cli("flushall") and "NOPERM" in cli("config", "get", "*")

        from kombu import Connection

        url = f"redis://agent-worker:{password}@127.0.0.1:{port}/0"
        with Connection(url) as conn:
            queue = conn.SimpleQueue("laps.check")
            queue.put({"run_id": "r1", "lap": 1})
            message = queue.get(timeout=5)
            assert message.payload == {"run_id": "r1", "lap": 1}
            message.ack()
            queue.close()
        with pytest.raises(Exception, match=r"(?i)auth|WRONGPASS|invalid"), \
                Connection(f"redis://127.0.0.1:{port}/0") as anonymous:
            anonymous.SimpleQueue("laps.check").put({"x": 1})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
