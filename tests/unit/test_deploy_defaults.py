"""Safe deploy defaults (issue 16, item 6): Flower and the metrics endpoint bind
loopback unless told otherwise, the demo's Flower password is random, and a
placeholder password stops a process at start instead of guarding it."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_worker.deploy_checks import check_deploy_secrets, is_placeholder, url_password
from agent_worker.errors import AgentWorkerError, PlaceholderSecretError
from agent_worker.settings import Settings
from tests.support import ROOT

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
    """Worker, beat and Flower all load ``tasks``: none starts on CHANGE_ME."""
    base = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    done = subprocess.run([sys.executable, "-c", "import tasks"], cwd=ROOT,
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
             "AGENT_WORKER_DATABASE_URL": f"postgresql+psycopg://{STRONG}@db.internal/aw"}
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
    readme = (ROOT / "README.md").read_text()
    assert "celery -A tasks flower --port=5555 --address=127.0.0.1" in readme
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
