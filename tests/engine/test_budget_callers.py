"""A caller's budget only tightens the agent's limits: a
``start_run(budget=...)`` used to replace the agent's budget wholesale, so
``Budget(max_laps=None, max_cost=None)`` lifted every limit. And a budget no
run can meet is refused where it is given. In process, on SQLite and on a
fresh real Postgres database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import update

from agent_worker import Budget, InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.budget import MAX_WALL_SECONDS, BudgetLedger
from agent_worker.core.errors import InvalidInputError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine import children
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from tests.principals import acting

AGENT_LIMITS = Budget(max_laps=3, max_cost=Decimal("5"), max_input_tokens=10_000,
                      on_exceed="fail")


@tool
def note(text: str) -> str:
    """A read step."""
    return text


def _forever(r: ModelRequest) -> ModelResponse:
    """A model that goes on for 8 laps: only a budget stops the run earlier."""
    if r.lap > 8:
        return turn("done")
    return turn(f"lap {r.lap}", [("note", {"text": "again"})])


@pytest.fixture
def w(dialect_url: str, agent_registry: Registry) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = agent_registry
    worker.rt.registry.register(Agent(name="capped", model=ScriptedModel(_forever),
                                      tools=[note], budget=AGENT_LIMITS))
    yield worker
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def _run_out(w: InProcessWorker, budget: Budget | None) -> Any:
    run = w.start_run("capped", "go", budget=budget)
    w.run_until_idle()
    return w.get_run(run.id)


def test_a_caller_cannot_lift_the_agents_limits_with_none(w: InProcessWorker) -> None:
    run = _run_out(w, Budget(max_laps=None, max_cost=None, max_input_tokens=None))
    assert run.limits["max_laps"] == 3
    assert Decimal(str(run.limits["max_cost"])) == Decimal("5")
    assert run.limits["max_input_tokens"] == 10_000
    assert (run.status, run.error_code, run.laps_used) == ("failed", "budget_exceeded", 3)


def test_a_looser_caller_limit_keeps_the_agents(w: InProcessWorker) -> None:
    run = _run_out(w, Budget(max_laps=50, max_cost=Decimal("100")))
    assert run.limits["max_laps"] == 3
    assert Decimal(str(run.limits["max_cost"])) == Decimal("5")
    assert run.laps_used == 3 and run.status == "failed"


def test_a_stricter_caller_limit_applies_and_unset_fields_keep_the_agents(
        w: InProcessWorker) -> None:
    run = _run_out(w, Budget(max_laps=2, max_output_tokens=999))
    assert run.limits["max_laps"] == 2 and run.limits["max_output_tokens"] == 999
    assert Decimal(str(run.limits["max_cost"])) == Decimal("5"), "not reset to the default"
    assert run.limits["max_input_tokens"] == 10_000
    assert (run.status, run.laps_used) == ("failed", 2)


def test_a_caller_may_choose_to_pause_and_only_raise_budget_lifts(w: InProcessWorker) -> None:
    run = _run_out(w, Budget(max_laps=None, on_exceed="pause"))
    assert (run.status, run.waiting_for, run.laps_used) == ("waiting", "budget", 3)
    # The operator verb still lifts a limit past the agent's own.
    raised = acting(w, "ops:dana").raise_budget(run.id, max_laps=5)
    assert raised.limits["max_laps"] == 5
    w.run_until_idle()
    run = w.get_run(run.id)
    assert (run.status, run.laps_used) == ("waiting", 5)


def test_no_caller_budget_is_the_agents() -> None:
    assert AGENT_LIMITS.tightened_by(None) == AGENT_LIMITS
    assert AGENT_LIMITS.tightened_by(Budget()) == AGENT_LIMITS
    assert Budget(max_laps=None).tightened_by(Budget(max_laps=7)).max_laps == 7


UNMEETABLE: dict[str, dict[str, Any]] = {
    "negative laps": {"max_laps": -1},
    "negative input tokens": {"max_input_tokens": -10},
    "negative output tokens": {"max_output_tokens": -10},
    "negative cost": {"max_cost": Decimal("-0.01")},
    "negative wall": {"max_wall_seconds": -1.0},
    "NaN wall": {"max_wall_seconds": float("nan")},
    "infinite wall": {"max_wall_seconds": float("inf")},
    "wall past year 9999": {"max_wall_seconds": MAX_WALL_SECONDS * 100.0},
}


@pytest.mark.parametrize("case", list(UNMEETABLE))
def test_a_budget_no_run_can_meet_is_refused_where_it_is_given(w: InProcessWorker,
                                                               case: str) -> None:
    """Was: a negative limit made a run that failed before its first lap
    ("0 of -1 laps"), and a wall limit of NaN or infinity failed
    ``start_run`` with a bare ``ValueError``/``OverflowError``. Now the
    budget, a caller's or an operator's raise, is refused as invalid input
    naming the limit, and nothing is written."""
    limits = UNMEETABLE[case]
    field = next(iter(limits))
    with pytest.raises(InvalidInputError, match=field):
        Budget(**limits)
    paused = _run_out(w, Budget(max_laps=None, on_exceed="pause"))
    with pytest.raises(InvalidInputError, match=field):
        acting(w, "ops:dana").raise_budget(paused.id, **limits)
    after = w.get_run(paused.id)
    assert (after.status, after.limits) == ("waiting", paused.limits)


def test_a_zero_limit_is_a_budget_already_spent(w: InProcessWorker) -> None:
    run = _run_out(w, Budget(max_laps=0))
    assert (run.status, run.error_code, run.laps_used) == ("failed", "budget_exceeded", 0)


def test_a_negative_limit_an_older_release_stored_still_reads_and_can_be_raised(
        w: InProcessWorker) -> None:
    """Limits read back from a run are taken as stored: a run paused with a
    negative limit before this release stays readable, and an operator's
    raise must leave every limit valid."""
    run = _run_out(w, Budget(max_laps=None, on_exceed="pause"))
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:
        c.execute(update(runs).where(runs.c.id == run.id)
                  .values(limits={**run.limits, "max_laps": -1}))
    assert w.get_state(run.id).limits.max_laps == -1
    # A raise that leaves the stored negative limit in place names it.
    with pytest.raises(InvalidInputError, match="max_laps"):
        acting(w, "ops:dana").raise_budget(run.id, max_cost=Decimal("9"))
    raised = acting(w, "ops:dana").raise_budget(run.id, max_laps=5)
    assert raised.limits["max_laps"] == 5
    w.run_until_idle()
    assert (w.get_run(run.id).status, w.get_run(run.id).laps_used) == ("waiting", 5)


def test_a_childs_share_of_a_wall_limit_an_older_release_allowed_is_capped() -> None:
    """A parent admitted with a wall limit past today's cap (older releases
    took any that made a date) still spawns: its children get the cap."""
    now = datetime.now(UTC)
    ledger = BudgetLedger(started_at=now, deadline=now + timedelta(seconds=MAX_WALL_SECONDS * 3))
    share = children.budget_share({"max_laps": 5}, ledger, 2)
    assert share.max_wall_seconds == MAX_WALL_SECONDS
