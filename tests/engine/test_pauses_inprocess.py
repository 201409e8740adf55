"""Pauses as first-class state, in-process: approvals, durable timers,
signals, cancellation and the budget ledger, driven by a ``ManualClock`` so a
test moves time forward instead of sleeping.

Every pause here is a committed lap plus a row: the worker that paused a run is
thrown away and a fresh one (``_reopen``) resumes it from the records, so what
the model sees after a pause can only come from the database.

Both dialects: on Postgres the sweeper compares timers and timeouts on the
database's clock, which a ``LockstepClock`` freezes at ``T0`` and moves with the
worker's. The session's database holds other tests' runs too: the agents live
in a registry of this module's (``AGENTS``), the workers' sweeps keep only the
laps of the test's own runs (``OwnRunsWorker``) and each approval listing is
filtered to the test's run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from agent_worker.agent import Agent, Registry
from agent_worker.control import sleep_tool, wait_for_signal_tool
from agent_worker.core.budget import Budget
from agent_worker.core.clock import ManualClock
from agent_worker.core.errors import AlreadyDecidedError, InvalidStateError
from agent_worker.core.messages import Message, ModelRequest, ModelResponse
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, model_turns, turn
from agent_worker.store.rows import signals
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext, tool
from tests.conftest import LockstepClock
from tests.engine.conftest import OwnRunsWorker
from tests.principals import acting

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

#: What the outside world saw, in order: (action, idempotency key, detail).
WORLD: list[tuple[str, str, Any]] = []
#: Every model request, per run: the model's view of the run.
REQUESTS: dict[str, list[ModelRequest]] = defaultdict(list)


@tool(kind="irreversible")
def transfer(account: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money: cannot be replayed or undone, so a human approves each call."""
    WORLD.append(("transfer", ctx.idempotency_key, amount_cents))
    return {"transfer_id": f"tr-{ctx.idempotency_key}", "account": account,
            "amount_cents": amount_cents}


@tool(kind="compensatable")
def reserve(item: str, ctx: ToolContext) -> dict[str, str]:
    """Hold stock; undone by releasing it."""
    WORLD.append(("reserve", ctx.idempotency_key, item))
    return {"reserved": item}


@reserve.compensator
def _unreserve(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, str]:
    WORLD.append(("release", ctx.idempotency_key, args["item"]))
    return {"released": args["item"]}


@tool(kind="idempotent", approval=True)
def discount(account: str, percent: int, ctx: ToolContext) -> dict[str, Any]:
    """Grant a discount: replay-safe, but a human approves it (or its timeout does)."""
    WORLD.append(("discount", ctx.idempotency_key, percent))
    return {"discount_id": f"dc-{ctx.idempotency_key}", "account": account, "percent": percent}


@tool
def note(text: str) -> str:
    """A read step that costs one model turn."""
    return text


def _plan(r: ModelRequest) -> ModelResponse:
    """Turn k (counted from the window, so pauses don't shift it) makes the
    calls of ``plan[k]``: one ``[tool, args]`` or a list of them."""
    REQUESTS[r.run_id].append(r)
    first = next(m for m in r.messages if m.role == "user")
    plan: list[Any] = json.loads(first.content)["plan"]
    k = model_turns(r)
    if k >= len(plan):
        return turn(json.dumps({"turns": k}))
    item = plan[k]
    calls = [tuple(c) for c in item] if isinstance(item[0], list) else [tuple(item)]
    return turn(f"turn {k}", calls)


#: This module's agents; its workers serve these and no others.
AGENTS = Registry()
BASE = AGENTS.register(Agent(
    name="pz", model=lambda: ScriptedModel(_plan),
    tools=[transfer, reserve, note, sleep_tool, wait_for_signal_tool], window_messages=2000,
    approval_owner="ops", approval_timeout=timedelta(hours=1)))
AGENTS.register(replace(BASE, name="pz-approve-default", on_approval_timeout="approve",
                        tools=[discount, note]))
AGENTS.register(replace(BASE, name="pz-escalate", on_approval_timeout="escalate",
                        escalate_to="ops-lead"))
AGENTS.register(replace(BASE, name="pz-priced",
                        prices={"scripted": {"input_per_mtok": "1", "output_per_mtok": "2"}}))

WIRE = ["transfer", {"account": "acct-9", "amount_cents": 12500}]


@pytest.fixture
def clock(dialect_url: str, request: pytest.FixtureRequest) -> ManualClock:
    """The worker's clock at ``T0``; on Postgres the database's follows it."""
    if dialect_url.startswith("sqlite"):
        return ManualClock(T0)
    return LockstepClock(T0, request.getfixturevalue("db_clock"))


@pytest.fixture
def url(dialect_url: str) -> str:
    """The test's database, which ``_reopen`` opens a fresh worker on."""
    return dialect_url


#: The workers a test opened (``_reopen`` swaps them): closed when it ends.
_OPENED: list[InProcessWorker] = []


@pytest.fixture
def w(url: str, clock: ManualClock) -> Iterator[InProcessWorker]:
    yield _worker(url, clock, set())
    while _OPENED:
        _OPENED.pop().close()


def _worker(url: str, clock: ManualClock, runs: set[str]) -> OwnRunsWorker:
    """A worker of this module's agents that runs only ``runs`` (``_start`` adds to it)."""
    worker = OwnRunsWorker(url, runs, clock=clock)
    worker.rt.registry = AGENTS
    _OPENED.append(worker)
    return worker


def _reopen(old: InProcessWorker, url: str, clock: ManualClock) -> InProcessWorker:
    """Throw the worker away and start another on the same database, as if the
    process that paused the run had died: only the records carry over."""
    assert isinstance(old, OwnRunsWorker)
    old.close()
    return _worker(url, clock, old.runs)


def _start(w: InProcessWorker, plan: list[Any], agent: str = "pz",
           budget: Budget | None = None) -> str:
    run = w.start_run(agent, {"plan": plan}, budget=budget)
    assert isinstance(w, OwnRunsWorker)
    w.runs.add(run.id)
    w.run_until_idle()
    return run.id


def _tool_messages(w: InProcessWorker, run_id: str) -> list[Message]:
    return [m.message for m in w.messages(run_id) if m.message.role == "tool"]


def _world(run_id: str, action: str | None = None) -> list[tuple[str, str, Any]]:
    return [e for e in WORLD if e[1].startswith(run_id) and (action is None or e[0] == action)]


def _seen_by_model(run_id: str) -> list[Message]:
    """The messages of the model's latest request."""
    return list(REQUESTS[run_id][-1].messages)


def _assert_laps_once(w: InProcessWorker, run_id: str) -> int:
    laps = w.get_run(run_id).lap
    assert [c[0] for c in w.checkpoints(run_id)] == list(range(laps + 1))
    commits = Counter(e.lap for e in w.events(run_id) if e.kind == "lap_committed")
    assert commits == Counter(range(1, laps + 1))
    return laps


def _at(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC"


# --- approvals ------------------------------------------------------------------


def test_approval_pauses_the_run_and_resumes_it_with_the_decision(
        w: InProcessWorker, url: str, clock: ManualClock) -> None:
    run_id = _start(w, [WIRE])
    run = w.get_run(run_id)
    assert run.status == "waiting" and run.waiting_for is not None
    assert run.waiting_for.startswith("approval:") and run.lease_owner is None
    assert _world(run_id) == []
    [approval] = w.list_approvals(run_id=run_id)
    assert approval.run_id == run_id and run.waiting_for == f"approval:{approval.id}"
    assert (approval.tool_name, approval.arguments) == ("transfer", WIRE[1])
    assert approval.owner == "ops" and approval.status == "pending"
    assert approval.requested_at == T0 and approval.timeout_at == T0 + timedelta(hours=1)
    assert approval.on_timeout == "reject" and approval.reason

    clock.advance(minutes=20)
    assert clock.now() - w.list_approvals(run_id=run_id)[0].requested_at == timedelta(
        minutes=20)
    assert w.run_until_idle() == 0, "a run waiting for a human runs nothing"

    w = _reopen(w, url, clock)
    decided = acting(w, "alice").approve(approval.id, comment="checked the invoice")
    assert (decided.status, decided.decided_by, decided.decided_at) == (
        "approved", "alice", clock.now())
    w.run_until_idle()
    done = w.get_run(run_id)
    assert done.status == "succeeded", done.error_detail
    assert _world(run_id) == [("transfer", f"{run_id}:1:0", 12500)]
    # Lap 1 asked, lap 2 ran the approved call, lap 3 answered: none replayed.
    assert _assert_laps_once(w, run_id) == 3

    with pytest.raises(AlreadyDecidedError, match="approved by alice"):
        acting(w, "bob").reject(run_id)
    with pytest.raises(AlreadyDecidedError):
        acting(w, "alice").approve(approval.id)
    assert w.list_approvals(run_id=run_id) == []
    assert [a.status for a in w.list_approvals(status="approved", run_id=run_id)] == ["approved"]
    decided_events = [e for e in w.events(run_id) if e.kind == "approval_decided"]
    assert len(decided_events) == 1 and decided_events[0].data is not None
    assert decided_events[0].data["by"] == "alice"

    # The model's account is rebuilt from the approval record: who, when, why.
    [result] = [m for m in _seen_by_model(run_id) if m.role == "tool"]
    assert not result.is_error
    for fact in ("alice", _at(T0 + timedelta(minutes=20)), "checked the invoice",
                 f"tr-{run_id}:1:0"):
        assert fact in result.content, (fact, result.content)


def test_rejection_is_told_to_the_model_and_nothing_is_done(
        w: InProcessWorker, url: str, clock: ManualClock) -> None:
    run_id = _start(w, [WIRE, ["note", {"text": "after"}]])
    clock.advance(hours=0.5)
    w = _reopen(w, url, clock)
    acting(w, "bob").reject(run_id, comment="wrong account")
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    assert _world(run_id) == [] and w.effects(run_id) == []
    rejected = _tool_messages(w, run_id)[0]
    assert rejected.is_error
    for fact in ("rejected by bob", _at(T0 + timedelta(minutes=30)), "wrong account"):
        assert fact in rejected.content, (fact, rejected.content)
    # No request the model ever saw claims an approval that was never given.
    assert not any("approved" in m.content.lower()
                   for r in REQUESTS[run_id] for m in r.messages if m.role == "tool")
    with pytest.raises(AlreadyDecidedError, match="rejected by bob"):
        acting(w, "alice").approve(run_id)


def test_approval_timeout_rejects_through_the_sweeper(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [WIRE])
    clock.advance(minutes=59)
    assert w.run_until_idle() == 0
    assert w.get_run(run_id).status == "waiting"
    assert [a.status for a in w.list_approvals(run_id=run_id)] == ["pending"]

    clock.advance(minutes=2)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    [timed_out] = w.list_approvals(status="timed_out", run_id=run_id)
    assert timed_out.decided_by == "system:timeout" and timed_out.decided_at == clock.now()
    assert _world(run_id) == []
    message = _tool_messages(w, run_id)[0]
    assert message.is_error and "timed out" in message.content
    assert "system:timeout" in message.content
    assert any(e.kind == "approval_timed_out" for e in w.events(run_id))
    with pytest.raises(AlreadyDecidedError, match="timed_out"):
        acting(w, "alice").approve(run_id, comment="too late")


def test_escalation_hands_the_approval_to_the_next_owner(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [WIRE], agent="pz-escalate")
    clock.advance(minutes=61)
    assert w.run_until_idle() == 0, "escalation re-routes the approval; the run keeps waiting"
    [escalated] = w.list_approvals(run_id=run_id)
    assert escalated.owner == "ops-lead" and escalated.status == "pending"
    assert escalated.timeout_at == clock.now() + timedelta(hours=1)
    assert w.get_run(run_id).status == "waiting"
    assert [e.data for e in w.events(run_id) if e.kind == "approval_escalated"] == [
        {"approval": escalated.id, "to": "ops-lead"}]

    # The escalated owner does not answer either: now the timeout rejects.
    clock.advance(minutes=61)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    assert [a.owner for a in w.list_approvals(status="timed_out", run_id=run_id)] == [
        "ops-lead"]
    assert _world(run_id) == []


def test_approve_on_timeout_runs_the_call_exactly_once(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [["discount", {"account": "acct-9", "percent": 10}]],
                    agent="pz-approve-default")
    clock.advance(minutes=61)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    assert _world(run_id) == [("discount", f"{run_id}:1:0", 10)]
    message = _tool_messages(w, run_id)[0]
    assert not message.is_error and "system:timeout" in message.content
    assert f"dc-{run_id}:1:0" in message.content
    assert w.run_until_idle() == 0 and len(_world(run_id)) == 1


# --- durable timers ---------------------------------------------------------------


@pytest.mark.parametrize("args", [{"seconds": 86400}, {"until": "2026-11-30T09:00:00Z"}])
def test_sleep_wakes_only_after_the_clock_passes_and_a_sweep(
        w: InProcessWorker, url: str, clock: ManualClock, args: dict[str, Any]) -> None:
    run_id = _start(w, [["sleep", args]])
    run = w.get_run(run_id)
    assert (run.status, run.wake_at, run.lease_owner) == ("sleeping", T0 + timedelta(days=1),
                                                          None)
    clock.advance(hours=23, minutes=59)
    assert w.sweep() == 0 and w.run_until_idle() == 0
    assert w.get_run(run_id).status == "sleeping"

    clock.advance(minutes=2)
    w = _reopen(w, url, clock)
    assert w.get_run(run_id).status == "sleeping", "time alone wakes nothing; the sweeper does"
    assert w.sweep() == 1
    assert w.get_run(run_id).status == "queued"
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    [slept] = _tool_messages(w, run_id)
    assert slept.content == (f"Slept from {_at(T0)}; woke at "
                             f"{_at(T0 + timedelta(days=1, minutes=1))}.")
    assert slept in _seen_by_model(run_id)
    assert [e.kind for e in w.events(run_id)].count("woken") == 1


# --- signals ----------------------------------------------------------------------


def _delivered(w: InProcessWorker, run_id: str) -> list[tuple[int, Any, int | None]]:
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        rows = c.execute(select(signals.c.id, signals.c.payload, signals.c.delivered_lap)
                         .where(signals.c.run_id == run_id).order_by(signals.c.id)).all()
    return [(r.id, r.payload, r.delivered_lap) for r in rows]


def test_signal_wait_times_out_through_the_sweeper(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [["wait_for_signal", {"name": "export_done", "timeout_seconds": 600}]])
    run = w.get_run(run_id)
    assert (run.status, run.waiting_for) == ("waiting", "signal:export_done")
    clock.advance(minutes=9)
    assert w.run_until_idle() == 0 and w.get_run(run_id).status == "waiting"
    clock.advance(minutes=2)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    [timed_out] = _tool_messages(w, run_id)
    assert timed_out.is_error
    assert timed_out.content == (f"No signal 'export_done' arrived between {_at(T0)[:-4]} and "
                                 f"{_at(T0 + timedelta(minutes=11))[:-4]} UTC (timed out).")
    # A signal after the timeout finds a finished run, not a lost lap.
    with pytest.raises(InvalidStateError):
        w.send_signal(run_id, "export_done", {"rows": 1})


def test_a_signal_sent_before_the_run_waits_is_not_lost(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [["sleep", {"seconds": 60}],
                        ["wait_for_signal", {"name": "signed", "timeout_seconds": 3600}]])
    assert w.get_run(run_id).status == "sleeping"
    sent = w.send_signal(run_id, "signed", {"by": "customer", "doc": "contract-7"})
    assert w.get_run(run_id).status == "sleeping", "a signal nobody waits for wakes nothing"
    clock.advance(minutes=2)
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "succeeded", run.error_detail
    got = json.loads(_tool_messages(w, run_id)[1].content)
    assert got == {"signal": "signed", "received_at": T0.isoformat(),
                   "payload": {"by": "customer", "doc": "contract-7"}}
    assert not any(e.data and e.data.get("paused") == "waiting" for e in w.events(run_id)), \
        "the signal was already there: the run never had to wait"
    assert [d[0] for d in _delivered(w, run_id)] == [sent.id]
    assert _delivered(w, run_id)[0][2] is not None
    assert _tool_messages(w, run_id)[1] in _seen_by_model(run_id)


def test_each_signal_is_delivered_into_exactly_one_lap(
        w: InProcessWorker, clock: ManualClock) -> None:
    wait = ["wait_for_signal", {"name": "item"}]
    run_id = _start(w, [wait, wait])
    assert w.get_run(run_id).waiting_for == "signal:item"
    w.send_signal(run_id, "item", {"n": 1})
    w.send_signal(run_id, "item", {"n": 2})
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    payloads = [json.loads(m.content)["payload"] for m in _tool_messages(w, run_id)]
    assert payloads == [{"n": 1}, {"n": 2}]
    delivered = _delivered(w, run_id)
    laps = [lap for _, _, lap in delivered]
    assert None not in laps and len(set(laps)) == 2, delivered


def test_two_waits_in_one_lap_take_two_signals(
        w: InProcessWorker, clock: ManualClock) -> None:
    wait = ["wait_for_signal", {"name": "item"}]
    run_id = _start(w, [["sleep", {"seconds": 1}], [wait, wait]])
    w.send_signal(run_id, "item", {"n": 1})
    w.send_signal(run_id, "item", {"n": 2})
    clock.advance(seconds=2)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    payloads = [json.loads(m.content)["payload"] for m in _tool_messages(w, run_id)[1:]]
    assert payloads == [{"n": 1}, {"n": 2}], "one signal must not be delivered twice"
    assert len({lap for _, _, lap in _delivered(w, run_id)}) == 1


# --- cancellation -------------------------------------------------------------------


def test_cancel_undoes_compensatable_effects_once_in_reverse_order(
        w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [["reserve", {"item": "a"}], ["reserve", {"item": "b"}],
                        ["sleep", {"seconds": 86400}]])
    assert w.get_run(run_id).status == "sleeping"
    acting(w, "carol").cancel(run_id, reason="customer withdrew")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "cancelled"
    assert (run.cancelled_by, run.cancel_reason) == ("carol", "customer withdrew")
    assert [(a, d) for a, _, d in _world(run_id)] == [
        ("reserve", "a"), ("reserve", "b"), ("release", "b"), ("release", "a")]
    statuses = {e.key: e.status for e in w.effects(run_id)}
    assert statuses == {f"{run_id}:1:0": "compensated", f"{run_id}:2:0": "compensated",
                        f"{run_id}:1:0:undo": "applied", f"{run_id}:2:0:undo": "applied"}
    with pytest.raises(InvalidStateError):
        w.cancel(run_id, reason="again")
    clock.advance(days=2)
    assert w.run_until_idle() == 0 and len(_world(run_id)) == 4


def test_cancel_voids_a_pending_approval(w: InProcessWorker) -> None:
    run_id = _start(w, [WIRE])
    acting(w, "carol").cancel(run_id, reason="no longer needed")
    w.run_until_idle()
    assert w.get_run(run_id).status == "cancelled"
    with pytest.raises(AlreadyDecidedError, match="cancelled by carol"):
        acting(w, "alice").approve(run_id)
    assert _world(run_id) == []


# --- budget ---------------------------------------------------------------------------

NOTES = [["note", {"text": f"n{i}"}] for i in range(10)]


@pytest.mark.parametrize(("agent", "budget", "spent"), [
    ("pz", Budget(max_laps=2), {"laps_used": 2}),
    ("pz", Budget(max_input_tokens=250), {"laps_used": 3, "input_tokens": 300}),
    ("pz", Budget(max_output_tokens=50), {"laps_used": 3, "output_tokens": 60}),
    ("pz-priced", Budget(max_cost=Decimal("0.0003")), {"laps_used": 3, "cost_micros": 420}),
], ids=["laps", "input-tokens", "output-tokens", "cost"])
def test_budget_exceeded_fails_the_run(w: InProcessWorker, agent: str, budget: Budget,
                                       spent: dict[str, int]) -> None:
    run_id = _start(w, NOTES, agent=agent, budget=budget)
    run = w.get_run(run_id)
    assert run.status == "failed"
    assert run.error_code == "budget_exceeded" and "budget spent" in (run.error_message or "")
    for field, value in spent.items():
        assert getattr(run, field) == value, (field, run)
    # One model call per lap, each 100 tokens in and 20 out; no call after the limit.
    assert len(REQUESTS[run_id]) == run.laps_used
    assert run.input_tokens == 100 * run.laps_used and run.output_tokens == 20 * run.laps_used


def test_deadline_counts_the_time_spent_paused(w: InProcessWorker, clock: ManualClock) -> None:
    run_id = _start(w, [["note", {"text": "a"}], ["sleep", {"seconds": 7200}], *NOTES],
                    budget=Budget(max_wall_seconds=3600))
    assert w.get_run(run_id).status == "sleeping"
    clock.advance(hours=2, seconds=1)
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "failed" and run.error_code == "budget_exceeded"
    assert "deadline passed" in (run.error_message or "")
    assert run.laps_used == 2 and len(REQUESTS[run_id]) == 2


def test_budget_pause_waits_for_a_human_to_raise_it(
        w: InProcessWorker, url: str, clock: ManualClock) -> None:
    run_id = _start(w, NOTES[:4], budget=Budget(max_laps=2, on_exceed="pause"))
    run = w.get_run(run_id)
    assert (run.status, run.waiting_for, run.error_code) == ("waiting", "budget",
                                                             "budget_exceeded")
    assert run.laps_used == 2 and "lap budget spent: 2 of 2" in (run.error_message or "")
    clock.advance(days=3)
    assert w.run_until_idle() == 0 and w.get_run(run_id).status == "waiting"

    w = _reopen(w, url, clock)
    raised = acting(w, "dana").raise_budget(run_id, max_laps=10)
    assert raised.limits["max_laps"] == 10 and raised.limits["on_exceed"] == "pause"
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "succeeded", run.error_detail
    assert run.laps_used == 5 and run.error_code is None, "the ledger kept counting"
    assert len(REQUESTS[run_id]) == 5
    assert [e.data["by"] for e in w.events(run_id)
            if e.kind == "budget_raised" and e.data] == ["dana"]
