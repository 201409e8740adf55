"""Flower on the same broker as the workers, with basic auth (as deploy/ runs
it): its HTTP API lists a run's lap tasks when searched by run id, and refuses
anyone without credentials."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_worker.api import AgentWorker
from tests.support import Fleet, Proc, wait_for

pytestmark = pytest.mark.integration

AUTH = ("ops", "s3cret-pass")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def flower(worker_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc([sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "flower",
                 f"--port={port}",
                 "--address=127.0.0.1"],
                {**worker_env, "FLOWER_BASIC_AUTH": ":".join(AUTH)},
                tmp_path / "flower.log").start()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.alive(), proc.log.read_text()[-3000:]
        try:
            return httpx.get(f"{base}/healthcheck", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=90, interval=0.3, what="flower to listen")
        yield base
    finally:
        proc.stop()


def test_flower_lists_a_runs_laps_by_run_id(aw: AgentWorker, fleet: Fleet,
                                           flower: str) -> None:
    # Flower only sees events sent while it listens: it starts first.
    fleet.worker(concurrency=1)
    run = aw.start_run("loop", {"laps": 3}, run_id="flower-run-1")
    assert aw.wait(run.id, timeout=120).status == "succeeded"

    url = f"{flower}/api/tasks"
    search = {"search": f"kwargs:run_id={run.id}"}

    def laps() -> dict[str, Any] | None:
        found: dict[str, Any] = httpx.get(url, params=search, auth=AUTH, timeout=10).json()
        done = [t for t in found.values() if t["state"] == "SUCCESS"]
        return found if len(done) == 3 else None

    tasks = wait_for(laps, timeout=60, interval=0.5, what="flower to record three laps")
    assert {t["name"] for t in tasks.values()} == {"agent_worker.run_lap"}
    lap_numbers = sorted(int(t["kwargs"].split("'lap': ")[1].rstrip("}")) for t in
                         tasks.values())
    assert lap_numbers == [1, 2, 3]
    assert all(f"'run_id': '{run.id}'" in t["kwargs"] for t in tasks.values())
    assert {t["result"] for t in tasks.values()} == {"'committed'", "'finished'"}

    # Another run's laps do not match the search.
    assert httpx.get(url, params={"search": "kwargs:run_id=some-other-run"}, auth=AUTH,
                     timeout=10).json() == {}

    # No credentials, or wrong ones: refused, for the API and the dashboard alike.
    assert httpx.get(url, params=search, timeout=10).status_code == 401
    assert httpx.get(url, params=search, auth=("ops", "wrong"), timeout=10).status_code == 401
    assert httpx.get(f"{flower}/tasks", timeout=10).status_code == 401
