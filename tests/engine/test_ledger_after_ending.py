"""Ledger truth after a run ends (issue 47, item 4): every ``pending`` or
``unknown`` effect of a cancelled or failed run is settled before the run is
final, the way a replay would settle it, except that an ending run never calls
a tool again: the tool's lookup decides, else a human (``effects resolve``).
In process, on SQLite and on Postgres; the worker-process proof is in
tests/integration/test_ledger_after_ending.py.

A lost reply is simulated by a vendor call that applies and then raises a
non-``ToolError`` exception: the intent stays pending and the lap is retried,
exactly as after a SIGKILL between the vendor's answer and the ledger's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.constants import compensation_key, effect_key
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.saga import compensate
from agent_worker.model.scripted import model_turns
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from agent_worker.tools import Tool, ToolContext, ToolKind
from tests.engine.conftest import OwnRunsWorker
from tests.principals import acting


class Crash(BaseException):
    """The worker died here (nothing in the lap catches a BaseException)."""


class Vendor:
    """A payments vendor that honours idempotency keys and can be asked by key.

    ``crash`` scripts the next calls: ``"after"`` applies, then the reply is
    lost; ``"before"`` loses the request. ``lookup_fails`` makes the next
    lookups raise (the vendor's lookup endpoint is down)."""

    def __init__(self) -> None:
        self.moved: Counter[str] = Counter()
        self.records: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.lookups: list[str] = []
        self.undone: Counter[str] = Counter()
        self.crash: list[str | None] = []
        self.lookup_fails = 0

    def charge(self, key: str, amount: int) -> dict[str, Any]:
        self.calls.append(key)
        mode = self.crash.pop(0) if self.crash else None
        if mode == "before":
            raise ConnectionResetError("request lost before the vendor saw it")
        if key not in self.records:
            self.moved[key] += 1
            self.records[key] = {"id": f"ch_{len(self.records)}", "amount": amount}
        if mode == "after":
            raise ConnectionResetError("reply lost after the vendor charged")
        return self.records[key]

    def find(self, key: str) -> dict[str, Any] | None:
        self.lookups.append(key)
        if self.lookup_fails:
            self.lookup_fails -= 1
            raise ConnectionError("the vendor's lookup answered 503")
        return self.records.get(key)

    def refund(self, key: str) -> dict[str, str]:
        original = key.removesuffix(":undo")
        if not self.undone[original]:
            self.undone[original] += 1
        return {"refunded": original}


def _charge_tool(vendor: Vendor, kind: ToolKind = "idempotent", *, lookup: bool = True) -> Tool:
    @tool(kind=kind)
    def charge(amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Charge the customer, passing the idempotency key."""
        return vendor.charge(ctx.idempotency_key, amount)

    if kind == "compensatable":
        charge.compensator(lambda args, result, ctx: vendor.refund(ctx.idempotency_key))
    if lookup:
        charge.lookup(vendor.find)
    assert isinstance(charge, Tool)
    return charge


def _model() -> ScriptedModel:
    """Turn k makes the calls of ``plan[k]`` (lists of ``[tool, args]``), then answers."""

    def script(r: ModelRequest) -> ModelResponse:
        plan: list[Any] = json.loads(next(m for m in r.messages if m.role == "user").content)
        k = model_turns(r)
        if k >= len(plan):
            return turn("done")
        return turn(f"turn {k}", [tuple(c) for c in plan[k]])

    return ScriptedModel(script)


@pytest.fixture
def w(dialect_url: str, agent_registry: Registry) -> Iterator[InProcessWorker]:
    worker = OwnRunsWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = agent_registry
    yield worker
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def _start(w: InProcessWorker, *tools: Tool, plan: list[Any]) -> str:
    w.rt.registry.register(Agent(name="ledger", model=_model(), tools=list(tools)))
    return w.start_run("ledger", plan).id


def _lost_reply(w: InProcessWorker, vendor: Vendor, *tools: Tool, crash: str = "after",
                plan: list[Any] | None = None) -> tuple[str, str]:
    """A run whose first charge's reply is lost: its ledger row is pending."""
    vendor.crash = [crash]
    run_id = _start(w, *tools, plan=plan or [[["charge", {"amount": 500}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle(max_laps=1)
    assert [(e.key, e.status) for e in w.effects(run_id)] == [(key, "pending")]
    return run_id, key


def _finished(w: InProcessWorker, run_id: str) -> dict[str, Any]:
    [event] = [e for e in w.events(run_id) if e.kind == "finished"]
    return event.data or {}


@pytest.mark.parametrize("landed", [True, False])
def test_a_cancel_settles_a_lost_reply_idempotent_charge_through_its_lookup(
        w: InProcessWorker, landed: bool) -> None:
    """The finding: the vendor took the money, the reply was lost, the run was
    cancelled before its replay. The final ledger must say what the vendor
    says (applied, with its record), not pending, and the ending must not
    call the vendor again (the cancel was to stop exactly that)."""
    vendor = Vendor()
    run_id, key = _lost_reply(w, vendor, _charge_tool(vendor),
                              crash="after" if landed else "before")
    acting(w, "carol").cancel(run_id, reason="customer withdrew")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.cancel_reason) == ("cancelled", "customer withdrew")
    [effect] = w.effects(run_id)
    assert vendor.calls == [key] and vendor.lookups == [key]
    if landed:
        assert (effect.status, effect.result) == ("applied", vendor.records[key])
        assert vendor.moved == {key: 1}
    else:
        assert (effect.status, effect.result) == ("not_applied", None)
        assert vendor.moved == {}
    assert _finished(w, run_id)["reconciled"] == {key: effect.status}


def test_a_cancel_settles_then_compensates_a_lost_reply_compensatable_charge(
        w: InProcessWorker) -> None:
    """Found applied by the lookup, a compensatable charge is then undone
    like the others, in reverse order, once."""
    vendor = Vendor()
    pay = _charge_tool(vendor, "compensatable")
    plan = [[["charge", {"amount": 100}]], [["charge", {"amount": 200}]]]
    vendor.crash = [None, "after"]
    run_id = _start(w, pay, plan=plan)
    k1, k2 = effect_key(run_id, 1, 0), effect_key(run_id, 2, 0)
    w.run_until_idle(max_laps=2)
    assert [e.status for e in w.effects(run_id)] == ["applied", "pending"]
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle()
    assert w.get_run(run_id).status == "cancelled"
    assert vendor.moved == {k1: 1, k2: 1} and vendor.undone == {k1: 1, k2: 1}
    status = {e.key: e.status for e in w.effects(run_id)}
    assert status == {k1: "compensated", k2: "compensated", compensation_key(k1): "applied",
                      compensation_key(k2): "applied"}
    assert _finished(w, run_id)["compensations"] == 2


def test_a_failed_run_settles_its_pending_charge_before_it_is_final(
        w: InProcessWorker) -> None:
    """The lap fails for good on its last attempt, whose reply was lost after
    the vendor charged: the failed run's ledger adopts the charge."""
    vendor = Vendor()
    vendor.crash = ["before", "before", "after"]
    run_id = _start(w, _charge_tool(vendor), plan=[[["charge", {"amount": 700}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "failed", (run.status, run.waiting_for, run.error_message)
    [effect] = w.effects(run_id)
    assert (effect.status, effect.result) == ("applied", vendor.records[key])
    assert vendor.moved == {key: 1} and vendor.calls == [key, key, key]


def test_without_a_lookup_the_ending_waits_for_a_human_and_never_calls_again(
        w: InProcessWorker) -> None:
    """An idempotent charge with no lookup could be settled by calling it again
    under its key; on a cancelled run that is the very call the cancel stops.
    So its outcome is unknown, the run waits on it (named), and a human's
    verdict lets the ending finish."""
    vendor = Vendor()
    run_id, key = _lost_reply(w, vendor, _charge_tool(vendor, lookup=False))
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.waiting_for, run.ending) == ("waiting", f"effect:{key}",
                                                          "cancelled")
    [effect] = w.effects(run_id)
    assert effect.status == "unknown" and "never calls a tool again" in (effect.error or "")
    [held] = [e for e in w.events(run_id) if e.kind == "effect_unknown"]
    assert held.data == {"key": key, "ending": "cancelled", "unknown": [key]}
    assert w.run_until_idle() == 0, "nothing re-runs a run waiting for a human"
    assert vendor.calls == [key]

    acting(w, "ops@example.com").resolve_effect(key, applied=True, result=vendor.records[key])
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.cancel_reason) == ("cancelled", "stop")
    [effect] = w.effects(run_id)
    assert (effect.status, effect.result) == ("applied", vendor.records[key])
    assert vendor.calls == [key] and vendor.moved == {key: 1}


def test_a_worker_killed_mid_ending_settles_nothing_twice(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the lookup settled the charge, before the run ended: the
    lap is sent again when the lease lapses, and that attempt finds the ledger
    settled (no second lookup, no second undo) and ends the run."""
    vendor = Vendor()
    run_id, key = _lost_reply(w, vendor, _charge_tool(vendor, "compensatable"))
    killed: list[bool] = []

    def dies_once(*args: Any, **kwargs: Any) -> int:
        if not killed:
            killed.append(True)
            raise Crash("SIGKILL after reconciling")
        return compensate(*args, **kwargs)

    # Where the ending calls it (engine.release imports it by name).
    monkeypatch.setattr("agent_worker.engine.release.compensate", dies_once)
    acting(w, "carol").cancel(run_id, reason="stop")
    with pytest.raises(Crash):
        w.run_until_idle()
    assert [e.status for e in w.effects(run_id)] == ["applied"]
    assert w.get_run(run_id).status == "running"
    _expire_lease(w, run_id)
    w.run_until_idle()
    assert w.get_run(run_id).status == "cancelled"
    assert vendor.lookups == [key] and vendor.calls == [key]
    assert vendor.moved == {key: 1} and vendor.undone == {key: 1}
    assert {e.key: e.status for e in w.effects(run_id)} == {
        key: "compensated", compensation_key(key): "applied"}


def test_a_failing_lookup_is_retried_then_settles(w: InProcessWorker) -> None:
    vendor = Vendor()
    run_id, key = _lost_reply(w, vendor, _charge_tool(vendor))
    vendor.lookup_fails = 1
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle()
    assert w.get_run(run_id).status == "cancelled"
    [effect] = w.effects(run_id)
    assert (effect.status, effect.result) == ("applied", vendor.records[key])
    assert vendor.lookups == [key, key] and vendor.calls == [key]


def test_an_ending_that_fails_for_good_names_its_unknown_effects(w: InProcessWorker) -> None:
    """The lookup never answers: after the attempt limit the run fails with
    ``compensation_failed``; its ledger says ``unknown`` (not ``pending``)
    and its error and ``finished`` event name the effect."""
    vendor = Vendor()
    run_id, key = _lost_reply(w, vendor, _charge_tool(vendor))
    vendor.lookup_fails = 1000
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle(max_laps=50)
    run = w.get_run(run_id)
    assert (run.status, run.error_code) == ("failed", "compensation_failed")
    assert key in (run.error_message or "")
    [effect] = w.effects(run_id)
    assert effect.status == "unknown"
    assert _finished(w, run_id)["unknown"] == [key]
    assert vendor.calls == [key] and len(vendor.lookups) == w.rt.settings.max_lap_attempts


def test_a_worker_that_lost_the_run_decides_nothing(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fenced like a commit: another worker took the run while this one was
    reading the ledger; this one neither asks the lookup nor marks anything."""
    vendor = Vendor()
    run_id, _ = _lost_reply(w, vendor, _charge_tool(vendor))
    acting(w, "carol").cancel(run_id, reason="stop")
    store = w.rt.store
    assert isinstance(store, SqlStore)
    real = store.list_effects

    def then_stolen(rid: str) -> Any:
        found = real(rid)
        with store.engine.begin() as c:
            c.execute(update(runs).where(runs.c.id == rid).values(lease_owner="someone-else"))
        return found

    monkeypatch.setattr(store, "list_effects", then_stolen)
    w.run_until_idle(max_laps=1)
    monkeypatch.undo()
    assert [e.status for e in w.effects(run_id)] == ["pending"]
    assert vendor.lookups == [] and w.get_run(run_id).status == "running"


def _expire_lease(w: InProcessWorker, run_id: str) -> None:
    """The dead worker's lease lapses (as the sweeper would find it)."""
    store = w.rt.store
    assert isinstance(store, SqlStore)
    past = w.rt.clock.now() - timedelta(minutes=5)
    with store.engine.begin() as c:
        c.execute(update(runs).where(runs.c.id == run_id).values(lease_expires_at=past))
