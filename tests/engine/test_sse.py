"""The SSE endpoint on both dialects: frames with ids, resume by
``Last-Event-ID`` (and ``?after=``), ``end`` last, clear errors for a bad
resume point and an unknown run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

import tests.agents  # noqa: F401  (registers the "loop" agent)
from agent_worker.core.principal import Principal
from agent_worker.inprocess import InProcessWorker
from agent_worker.sse import create_app
from agent_worker.webauth import WebAuth, token_digest

#: The app's one bearer token: the single-tenant admin (tenancy: tests/integration/test_webauth.py).
AUTH = WebAuth(tokens={token_digest("t0ken"): Principal("sse-test", "*", {"admin"})})
BEARER = {"Authorization": "Bearer t0ken"}


@pytest.fixture
def worker(dialect_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url)
    yield w
    w.run_until_idle()  # no run left queued on the shared database for later tests' sweeps
    w.close()


def frames(body: str) -> list[dict[str, str]]:
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if ": " in line and not line.startswith(":"))
        if "event" in fields:
            out.append(fields)
    return out


def test_events_resume_by_last_event_id(worker: InProcessWorker) -> None:
    run = worker.start_run("loop", {"laps": 2}, run_id=f"e-{uuid.uuid4().hex[:8]}")
    worker.run_until_idle()
    http = TestClient(create_app(worker, auth=AUTH), headers=BEARER)
    first = http.get(f"/runs/{run.id}/events")
    assert first.status_code == 200
    assert first.headers["content-type"].startswith("text/event-stream")
    got = frames(first.text)
    assert [f["event"] for f in got] == ["run_created", "lap_committed", "lap_committed", "end"]
    assert [int(f["id"]) for f in got[:-1]] == [e.id for e in worker.events(run.id)]
    assert json.loads(got[1]["data"])["messages"][1]["role"] == "tool"
    resumed = frames(http.get(f"/runs/{run.id}/events",
                              headers={"Last-Event-ID": got[1]["id"]}).text)
    assert [f["event"] for f in resumed] == ["lap_committed", "end"]
    by_query = frames(http.get(f"/runs/{run.id}/events?after={got[2]['id']}").text)
    assert [f["event"] for f in by_query] == ["end"]


def test_bad_resume_point_and_unknown_run(worker: InProcessWorker) -> None:
    run = worker.start_run("loop", {"laps": 1}, run_id=f"e-{uuid.uuid4().hex[:8]}")
    http = TestClient(create_app(worker, auth=AUTH), headers=BEARER)
    bad = http.get(f"/runs/{run.id}/events", headers={"Last-Event-ID": "12\r\nx"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    missing = http.get("/runs/nope/events")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_run"
