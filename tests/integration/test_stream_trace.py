"""Streaming and tracing through real ``celery -A agent_worker.tasks worker``
processes: a client that reconnects three times during a 50-lap
run sees every event once, in order; a run's lap spans all hang under the
caller's span, with a SIGKILLed and replayed lap visible as two attempts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_worker.api import AgentWorker
from agent_worker.streaming import StreamEvent
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER = "b7ad6b7169203331"


def test_stream_reconnecting_three_times_sees_every_event_once(
        aw: AgentWorker, fleet: Fleet) -> None:
    fleet.worker(concurrency=2)
    run = aw.start_run("loop", {"laps": 50})
    seen: list[StreamEvent] = []
    after, reconnects = 0, 0
    for drop_after in (5, 15, 15, None):  # three disconnects mid-run (51 events), then the end
        taken = 0
        for event in aw.stream(run.id, after=after):
            seen.append(event)
            after, taken = event.id, taken + 1
            if taken == drop_after:
                reconnects += 1
                break
        if seen[-1].kind == "end":
            break
    assert reconnects == 3
    assert seen[-1].kind == "end" and seen[-1].data and seen[-1].data["status"] == "succeeded"
    stored = [e.id for e in aw.events(run.id)]
    assert [e.id for e in seen[:-1]] == stored  # every event once, in order
    assert [e.lap for e in seen if e.kind == "lap_committed"] == list(range(1, 51))
    assert aw.get_run(run.id).lap == 50


def test_trace_of_a_run_with_a_killed_lap(aw: AgentWorker, fleet: Fleet,
                                          tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    fleet.worker(concurrency=1, AGENT_WORKER_FAULTS="after_model_journal",
                 AGENT_WORKER_TRACE_EXPORT=f"file:{spans_file}")
    fleet.beat()
    run = aw.start_run("loop", {"laps": 3}, traceparent=f"00-{TRACE_ID}-{CALLER}-01")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    # The last lap's span ends (and is written) just after its commit made the
    # run ``succeeded``: wait for the file to hold this run's four lap spans.
    def read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in spans_file.read_text().splitlines()]

    def run_laps(spans: list[dict[str, Any]]) -> int:
        return sum(1 for s in spans if s["name"] == "lap loop"
                   and s["attributes"].get("agent_worker.run_id") == run.id)

    wait_for(lambda: run_laps(read()) >= 4, timeout=30, what="the last lap's span")
    every = read()
    # This run's lap spans and their children (beat may resume other tests' runs).
    ours = {s["context"]["span_id"] for s in every
            if s["attributes"].get("agent_worker.run_id") == run.id}
    spans = [s for s in every if s["context"]["span_id"] in ours or s["parent_id"] in ours]
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{TRACE_ID}"}  # one trace
    laps = [s for s in spans if s["name"] == "lap loop"]
    assert all(s["parent_id"] == f"0x{CALLER}" for s in laps)
    attempts = sorted((s["attributes"]["agent_worker.lap"], s["attributes"]["agent_worker.attempt"])
                      for s in laps)
    assert attempts == [(1, 1), (1, 2), (2, 1), (3, 1)]  # the killed lap 1 shows twice
    lost = next(s for s in laps if s["attributes"].get("agent_worker.lap.lost"))
    # What the killed attempt did before dying (its claim, its model call)
    # hangs under the lost attempt's span.
    under_lost = {s["name"] for s in spans if s["parent_id"] == lost["context"]["span_id"]}
    assert {"claim", "chat scripted"} <= under_lost

