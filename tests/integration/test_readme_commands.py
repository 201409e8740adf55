"""Every shell command README.md, deploy/README.md and the documentation
site's pages (docs/) show is checked, so the docs cannot drift again (the
README's Flower command crashed for months).

Each command matches exactly one rule below; a command no rule knows fails the
test, so a new README command needs a check. How each kind is checked:

- ``run``: executed as written against the test session's Postgres and Redis;
  it must exit 0 without a traceback.
- ``serve``: long-running (worker, beat, Flower, metrics): started as written,
  it must come up (its ready line, or its HTTP endpoint answering) and keep
  running; then it is stopped.
- ``first_hour``: the two set-up commands (and install.sh, which both run) and
  the "first hour" walkthrough, executed in order on a fresh clone by
  ``test_first_hour.py``.
- ``pytest_args``: ``test.sh`` or pytest with arguments: every path must exist
  under tests/ (the suite runs it: test.sh is what CI runs) and every marker be
  declared.
- ``make_dry``: Makefile targets exist and expand (``make -n``); ``make test`` is
  test.sh, which CI runs.
- ``usage``: commands with placeholders (RUN, KEY) or that run for minutes
  (benchmarks): ``--help`` must work and list every option the README uses
  (``agent-worker`` in-process: seventeen interpreter starts would cost a minute).
- ``host``: systemd, Kubernetes and Docker commands, which cannot run on this
  kind of machine (no systemd as PID 1, no cluster, no Docker Engine): every
  file, unit, Kubernetes object, container and Compose service they name must
  exist in deploy/.
"""

from __future__ import annotations

import glob
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT, answers, wait_for
from tests.support_docs import commands, readme_walkthrough

pytestmark = pytest.mark.integration

Check = Callable[[str, "Env"], None]


class Env:
    """A shell environment for README commands: the test's services, this
    checkout's code (``agent-worker`` runs it, not an installed copy)."""

    def __init__(self, database_url: str, broker_url: str, tmp: Path) -> None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "agent-worker"
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m agent_worker.cli "$@"\n')
        shim.chmod(0o755)
        self.tmp = tmp
        self.vars = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
        self.vars.update(PYTHONPATH=str(ROOT), PATH=f"{bin_dir}:{os.environ['PATH']}",
                         AGENT_WORKER_DATABASE_URL=database_url,
                         AGENT_WORKER_BROKER_URL=broker_url, FLOWER_BASIC_AUTH="doc:test")

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=ROOT, env=self.vars, text=True,
                              capture_output=True, timeout=timeout, check=False)


def run(command: str, env: Env) -> None:
    done = env.run(command)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, f"{command}:\n{output[-3000:]}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def serve(command: str, env: Env) -> None:
    port = re.search(r"--port[= ](\d+)", command)
    if "metrics" in command or "flower" in command or " console" in command:
        number = int(port.group(1)) if port else (8090 if " console" in command else 9100)
        if not _port_free(number):
            if os.environ.get("CI"):
                pytest.fail(f"port {number} is taken; cannot check {command!r}")
            pytest.skip(f"port {number} is taken on this machine")
        path = ("/metrics" if "metrics" in command
                else "/healthz" if " console" in command else "/healthcheck")
        ready: Callable[[str], bool] = lambda _log: answers(  # noqa: E731
            f"http://127.0.0.1:{number}{path}")
    else:
        mark = "beat: Starting" if " beat" in command else " ready."
        ready = lambda log: mark in log  # noqa: E731
    log_path = env.tmp / f"serve-{abs(hash(command))}.log"
    with open(log_path, "wb") as log:
        # beat writes its schedule file into the working directory.
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=env.tmp, env=env.vars,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or ready(log_path.read_text(errors="replace")),
                 timeout=60, interval=0.2, what=f"{command} to come up")
        time.sleep(0.5)
        output = log_path.read_text(errors="replace")
        assert proc.poll() is None, f"{command} exited {proc.returncode}:\n{output[-3000:]}"
        assert "Traceback" not in output, output[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def first_hour(command: str, env: Env) -> None:
    assert command in ("deploy/local/demo.sh", "deploy/local/test.sh",
                       "deploy/local/install.sh") or command in readme_walkthrough()
    assert (ROOT / "tests/integration/test_first_hour.py").exists()


def pytest_args(command: str, env: Env) -> None:
    words = shlex.split(command)
    args = words[3:] if words[:3] == ["python", "-m", "pytest"] else words[1:]
    markers = {m.split(":")[0] for m in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    for i, arg in enumerate(args):
        if arg.startswith("tests/"):
            assert (ROOT / arg).exists(), f"{command}: {arg} does not exist"
        if i and args[i - 1] == "-m":
            names = set(re.findall(r"\w+", arg)) - {"not", "and", "or"}
            assert names <= markers, f"{command}: undeclared markers {names - markers}"


def make_dry(command: str, env: Env) -> None:
    run(f"make -n {command.split(' ', 1)[1]}", env)


def _cli_help(words: list[str]) -> str:
    from agent_worker.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*words, "--help"])
    assert code == 0, f"agent-worker {' '.join(words)} --help: {err.getvalue()}"
    return out.getvalue()


def usage(command: str, env: Env) -> None:
    words = shlex.split(command)
    if words[0] == "agent-worker" and "|" in command:  # the synopsis line
        for sub in command.split(" ", 1)[1].split("|"):
            _cli_help(sub.split(" [")[0].replace(" RUN", "").split())
        return
    options_at = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    head = [w for w in words[:options_at] if not w.isupper()]
    if head[0] == "agent-worker":
        text = _cli_help(head[1:])
    else:
        done = env.run(shlex.join([*head, "--help"]))
        assert done.returncode == 0, done.stdout + done.stderr
        text = done.stdout
    for option in re.findall(r"--[a-z-]+", command):
        assert option in text, f"{command}: {option} is not in its --help"


def _k8s_objects() -> set[tuple[str, str]]:
    found = set()
    for path in (ROOT / "deploy/k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "metadata" in doc:
                found.add((doc["kind"].lower(), doc["metadata"]["name"]))
                for c in (doc.get("spec", {}).get("template", {}).get("spec", {})
                          .get("containers", [])):
                    found.add(("container", c["name"]))
    return found


def host(command: str, env: Env) -> None:
    for word in shlex.split(command.replace("{1..4}", "1")):
        if word.startswith("deploy/") and not word.startswith("deploy/.env"):
            assert glob.glob(str(ROOT / word)), f"{command}: {word} does not exist"
    if command.startswith("systemctl"):
        for unit in re.findall(r"agent-worker-[a-z]+(?:@\S+)?", command):
            name = re.sub(r"@\S+", "@", unit) + ".service"
            assert (ROOT / "deploy/systemd" / name).exists(), f"{command}: no {name}"
    if command.startswith("kubectl"):
        objects = _k8s_objects()
        kinds = {"deployment": "deployment", "job": "job", "svc": "service"}
        for kind, name in re.findall(r"\b(deployment|job|svc)/([\w-]+)", command):
            assert (kinds[kind], name) in objects, f"{command}: no {kind}/{name} in deploy/k8s"
        for container in re.findall(r"\s(\w+)=REGISTRY/", command):
            assert ("container", container) in objects, f"{command}: no container {container}"
        if "delete job" in command:
            assert ("job", command.split()[3]) in objects
    if command.startswith("docker compose"):
        services = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())["services"]
        for name in re.findall(r"--scale (\w+)=", command) + re.findall(r" (worker)$", command):
            assert name in services, f"{command}: no Compose service {name}"
    if command.startswith("$EDITOR") or " $EDITOR " in command:
        assert glob.glob(str(ROOT / "deploy/.env.example"))


def a_setting(command: str, env: Env) -> None:
    """``AGENT_WORKER_NAME=value`` shown as configuration: a setting that
    exists, and a value it accepts."""
    from agent_worker.core.settings import Settings

    name, value = command.split("=", 1)
    field = name.removeprefix("AGENT_WORKER_").lower()
    assert field in Settings.model_fields, f"{name} is not a setting"
    Settings.model_validate({field: value})


def prints_a_key(command: str, env: Env) -> None:
    """The console's key generator: one line, long enough for the check it meets."""
    done = env.run(command)
    assert done.returncode == 0 and len(done.stdout.strip()) >= 32, done


def roles_file(command: str, env: Env) -> None:
    """The database roles' file, run by hand: it exists, and the command gives
    it exactly the passwords it reads (tests/integration/test_database_roles.py
    runs it against a Postgres of its own)."""
    path = ROOT / command.split(" -f ", 1)[1].split()[0]
    wanted = set(re.findall(r"^\\getenv \w+ (\w+)$", path.read_text(), re.M))
    assert wanted and set(re.findall(r"(AGENT_WORKER_\w+)=", command)) == wanted, command


def in_the_embedding_test(command: str, env: Env) -> None:
    """An application's own app (README, "Add agent-worker to your
    application"): the embedding test starts it from such a folder."""
    test = (ROOT / "tests/integration/test_embedding.py").read_text()
    assert '"-m", "celery", "-A", "tasks", *args' in test
    assert f'celery("{command.split()[-1]}"' in test


RULES: list[tuple[str, Check]] = [
    (r"agent-worker db upgrade|agent-worker runs list --stale"
     r"|agent-worker runs list --agent-version OLD --status running"
     r"|agent-worker runs list --status failed"
     r"|deploy/local/services\.sh start", run),
    (r"agent-worker (worker --concurrency 8|beat|metrics( --port 9100)?)"
     r"|agent-worker console --host 127\.0\.0\.1 --port 8090"
     r"|celery -A agent_worker.tasks (flower --port=5555 --address=127.0.0.1|beat --loglevel INFO"
     r"|worker --loglevel INFO --without-mingle)", serve),
    (r"celery -A tasks (worker|beat)", in_the_embedding_test),
    (r"deploy/local/(demo|test|install)\.sh", first_hour),
    (r"deploy/local/test\.sh .+|python -m pytest .+", pytest_args),
    (r"make [a-z -]+", make_dry),
    (r"agent-worker submit\|.*|agent-worker (effects resolve KEY|retry RUN).*"
     r"|agent-worker (runs (state|update-state) RUN|approve RUN|runs list --label) .*"
     r"|agent-worker runs state RUN"
     r"|python -m bench\.\w+( .*)?", usage),
    (r"agent-worker schedules [a-z]+( NAME( AGENT)?)?( .*)?", usage),
    (r"agent-worker console( hash-password( --stdin)?)?", usage),
    (r"AGENT_WORKER_[A-Z_]+=\S+", a_setting),
    (r"(AGENT_WORKER_[A-Z]+_PASSWORD=\.\.\. )+psql .* -f deploy/k8s/postgres-roles\.sql",
     roles_file),
    (r"python -c 'import secrets; print\(secrets\.token_urlsafe\(32\)\)'", prints_a_key),
    (r"agent-worker runs follow RUN .*", usage),
    (r"agent-worker (queues|share( [a-z]+( .*)?)?|runs show RUN( --laps)?|runs list --parent RUN"
     r"|submit [a-z-]+ .*)", usage),
    (r"agent-worker (cancel RUN .*|approvals list|audit( .*)?)", usage),
    (r"agent-worker budget raise RUN .*", usage),
    (r"mkdocs (serve|build)( .*)?", usage),
    (r"(useradd|python3\.11 -m venv|/opt/agent-worker/venv/bin/pip|install|\$EDITOR|cp"
     r"|systemctl|docker compose|kubectl) .*|kubectl kustomize", host),
]


def _rule(command: str) -> Check | None:
    if command in readme_walkthrough():
        return first_hour
    matched = [check for pattern, check in RULES if re.fullmatch(pattern, command)]
    assert len(matched) <= 1, f"{command!r} matches several rules"
    return matched[0] if matched else None


def test_every_readme_command_has_a_check() -> None:
    unchecked = [f"{doc}: {c}" for doc, c in commands() if _rule(c) is None]
    assert not unchecked, "README commands with no rule in this file:\n" + "\n".join(unchecked)
    assert len(readme_walkthrough()) >= 5


@pytest.fixture(scope="module")
def env(database_url: str, broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    return Env(database_url, broker_url, tmp_path_factory.mktemp("readme"))


def _params() -> list[Any]:
    """Every README command; those served on a fixed port (metrics on 9100
    twice, with and without ``--port``) share one xdist worker
    (``--dist loadgroup``), so two of them never race for the port."""
    return [pytest.param(c, marks=pytest.mark.xdist_group("readme-fixed-ports"))
            if _rule(c) is serve else c for c in sorted({c for _, c in commands()})]


@pytest.mark.parametrize("command", _params())
def test_readme_command(command: str, env: Env) -> None:
    check = _rule(command)
    if check is None:
        pytest.fail(f"no rule for {command!r}")
    check(command, env)
