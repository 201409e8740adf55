"""Lap traces in process, on both dialects: every lap span under the caller's
span with claim, model, tool and commit children and the gen_ai.* attributes;
a lost attempt shows as its own span; a bad traceparent is refused; tracing
off writes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.agents  # noqa: F401  (registers the "loop" agent)
from agent_worker.core.errors import InvalidInputError
from agent_worker.inprocess import InProcessWorker
from agent_worker.tracing import lap_span_id

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"


@pytest.fixture
def spans_file(tmp_path: Path) -> Path:
    return tmp_path / "spans.jsonl"


@pytest.fixture
def worker(dialect_url: str, spans_file: Path) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, trace_export=f"file:{spans_file}")
    yield w
    w.close()


def read_spans(path: Path, run_id: str) -> list[dict[str, Any]]:
    """The spans of ``run_id``'s laps and their children (the sweeper of an
    in-process worker on the shared test database may run other tests' laps)."""
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    laps = {s["context"]["span_id"] for s in spans
            if s["attributes"].get("agent_worker.run_id") == run_id}
    return [s for s in spans if s["context"]["span_id"] in laps or s["parent_id"] in laps]


def _hex(value: str | None) -> str | None:
    return value[2:] if value else None


def test_every_lap_hangs_under_the_callers_span(worker: InProcessWorker,
                                                spans_file: Path) -> None:
    run = worker.start_run("loop", {"laps": 3}, run_id=f"t-{uuid.uuid4().hex[:8]}",
                           traceparent=f"00-{TRACE_ID}-{CALLER}-01")
    worker.run_until_idle()
    spans = read_spans(spans_file, run.id)
    assert {_hex(s["context"]["trace_id"]) for s in spans} == {TRACE_ID}
    laps = [s for s in spans if s["name"] == "lap loop"]
    assert sorted(s["attributes"]["agent_worker.lap"] for s in laps) == [1, 2, 3]
    for lap in laps:
        assert _hex(lap["parent_id"]) == CALLER
        a = lap["attributes"]
        assert (a["agent_worker.run_id"], a["agent_worker.agent"], a["agent_worker.attempt"]) \
            == (run.id, "loop", 1)
        derived = lap_span_id(run.id, a["agent_worker.lap"], 1)
        assert _hex(lap["context"]["span_id"]) == f"{derived:016x}"
        children = [s for s in spans if s["parent_id"] == lap["context"]["span_id"]]
        names = [c["name"] for c in children]
        assert names[0] == "claim" and "commit" in names and "chat scripted" in names
        if a["agent_worker.lap"] < 3:
            assert "execute_tool step" in names
    chat = next(s for s in spans if s["name"] == "chat scripted")
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.usage.input_tokens"] > 0
    tool = next(s for s in spans if s["name"] == "execute_tool step")
    assert tool["attributes"]["gen_ai.tool.name"] == "step"


def test_a_lost_attempt_is_its_own_span(worker: InProcessWorker, spans_file: Path) -> None:
    """Attempt 1 claims and vanishes (its lease lapses at once); attempt 2
    emits attempt 1's lap span under the derived id, so both show."""
    run = worker.start_run("loop", {"laps": 1}, run_id=f"t-{uuid.uuid4().hex[:8]}",
                           traceparent=f"00-{TRACE_ID}-{CALLER}-01")
    assert worker.rt.store.claim(run.id, 1, owner="ghost", now=worker.rt.clock.now(),
                                 lease_seconds=0.001, window_messages=10) is not None
    worker.queue.pending.clear()
    worker.run_until_idle()
    laps = [s for s in read_spans(spans_file, run.id) if s["name"] == "lap loop"]
    attempts = {s["attributes"]["agent_worker.attempt"]: s for s in laps}
    assert sorted(attempts) == [1, 2]
    assert attempts[1]["attributes"]["agent_worker.lap.lost"] is True
    assert attempts[1]["status"]["status_code"] == "ERROR"
    assert _hex(attempts[1]["context"]["span_id"]) == f"{lap_span_id(run.id, 1, 1):016x}"
    assert all(_hex(s["parent_id"]) == CALLER for s in laps)


def test_bad_traceparent_is_refused(worker: InProcessWorker) -> None:
    for bad in ("", "00-abc", f"ff-{TRACE_ID}-{CALLER}-01", f"00-{'0' * 32}-{CALLER}-01",
                f"00-{TRACE_ID.upper()}-{CALLER}-01", f"00-{TRACE_ID}-{CALLER}-01\n"):
        with pytest.raises(InvalidInputError):
            worker.start_run("loop", {"laps": 1}, traceparent=bad)


def test_off_writes_nothing(dialect_url: str, spans_file: Path) -> None:
    w = InProcessWorker(dialect_url)
    try:
        w.start_run("loop", {"laps": 1})
        w.run_until_idle()
    finally:
        w.close()
    assert not spans_file.exists()


def test_an_exporter_that_cannot_start_costs_the_traces_not_the_lap(tmp_path: Path) -> None:
    """``otlp`` without the extra installed (as here) or an unknown value:
    laps run untraced, with an error logged, instead of failing."""
    w = InProcessWorker(f"sqlite:///{tmp_path / 'aw.db'}", trace_export="bogus")
    try:
        run = w.start_run("loop", {"laps": 1})
        w.run_until_idle()
        assert w.get_run(run.id).status == "succeeded"
    finally:
        w.close()
