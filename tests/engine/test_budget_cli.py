"""``agent-worker budget raise`` in process, on both dialects: a run paused
on its budget resumes with the limits given (the others kept), the API's
audit log records who raised it; a run not waiting, no limit, or a bad
limit is refused with its exit code and nothing changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agent_worker.api as api
from agent_worker.agent import Agent, Registry
from agent_worker.core.budget import Budget
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import tool
from tests.engine.cli_json import cli
from tests.engine.conftest import OwnRunsWorker


@tool
def note(text: str) -> str:
    """Note something down."""
    return text


def _script(r: ModelRequest) -> ModelResponse:
    """A note a lap, done at the third: over a one-lap budget at the second."""
    return turn("done") if r.lap >= 3 else turn("noting", [("note", {"text": str(r.lap)})])


@pytest.fixture
def w(dialect_url: str) -> Iterator[OwnRunsWorker]:
    worker = OwnRunsWorker(dialect_url)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(
        name="thrifty", model=ScriptedModel(_script), tools=[note],
        budget=Budget(max_laps=1, max_output_tokens=10_000, on_exceed="pause")))
    api.configure(worker)
    yield worker
    api.configure(None)
    worker.close()




def test_budget_raise_resumes_a_paused_run_and_is_audited(w: OwnRunsWorker) -> None:
    run = w.start_run("thrifty", "go")
    w.run_until_idle()
    paused = w.get_run(run.id)
    assert paused.status == "waiting" and paused.waiting_for == "budget"
    assert cli("budget", "raise", run.id, code=2)["code"] == "usage"  # no limit given
    assert cli("budget", "raise", run.id, "--max-cost", "lots", code=2)["code"] == "invalid_input"
    assert w.get_run(run.id).limits == paused.limits
    raised = cli("budget", "raise", run.id, "--max-laps", "5", "--max-cost", "2.50")
    assert raised["id"] == run.id and raised["status"] == "queued"
    limits = w.get_run(run.id).limits
    assert limits["max_laps"] == 5 and limits["max_cost"] == "2.50"
    assert limits["max_output_tokens"] == 10_000  # not given: kept
    (entry,) = w.audit(action="raise_budget", run_id=run.id)
    assert entry.changes is not None and entry.changes["to"]["max_laps"] == 5
    w.run_until_idle()
    assert w.get_run(run.id).status == "succeeded"
    again = cli("budget", "raise", run.id, "--max-laps", "9", code=4)
    assert again["code"] == "invalid_state"
    assert cli("budget", "raise", "no-such-run", "--max-laps", "9", code=3)["code"]
