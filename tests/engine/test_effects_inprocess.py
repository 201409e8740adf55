"""The effect ledger's replay rules, in-process on SQLite (DESIGN.md, lap
protocol step 4): fast checks of each rule; the worker-process proofs are in
tests/integration/test_effects.py.

A "crash mid-call" is simulated by a tool that raises a non-``ToolError``
exception after (or before) the fake vendor applied the call: the engine then
leaves the intent pending and retries the lap, exactly as after a SIGKILL.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.constants import compensation_key, effect_key
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.tools import Tool, ToolContext, ToolKind
from tests.principals import acting


class FakeVendor:
    """An in-memory payments vendor: what really moved, by idempotency key.

    ``crash`` lists what the next calls do: ``"after"`` applies then loses the
    answer, ``"before"`` loses the request; both raise like a dropped connection.
    """

    def __init__(self, *, honours_keys: bool = True) -> None:
        self.honours_keys = honours_keys
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[str] = []
        self.crash: list[str] = []

    def pay(self, key: str, **params: Any) -> dict[str, Any]:
        self.calls.append(key)
        mode = self.crash.pop(0) if self.crash else None
        if mode == "before":
            raise ConnectionResetError("connection reset before the vendor saw the request")
        done = self.find(key)
        if done is None or not self.honours_keys:
            done = {"id": f"re_{len(self.applied)}", **params, "idempotency_key": key}
            self.applied.append((key, done))
        if mode == "after":
            raise ConnectionResetError("connection reset after the vendor applied it")
        return done

    def find(self, key: str) -> dict[str, Any] | None:
        return next((r for k, r in self.applied if k == key), None)

    def by_key(self) -> Counter[str]:
        return Counter(k for k, _ in self.applied)


@pytest.fixture
def worker(dialect_url: str, agent_registry: Registry) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0,
                        max_lap_attempts=3)
    w.rt.registry = agent_registry
    yield w
    w.rt.store.dispose()


def _plan(*laps: list[tuple[str, dict[str, Any]]]) -> ScriptedModel:
    """A model that asks for ``laps[k-1]``'s calls on lap ``k``, then answers "done"."""

    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > len(laps):
            return turn("done")
        return turn(f"lap {r.lap}", laps[r.lap - 1])

    return ScriptedModel(script)


def _agent(w: InProcessWorker, tools: list[Tool], *laps: list[tuple[str, dict[str, Any]]],
           name: str = "fx") -> str:
    w.rt.registry.register(Agent(name=name, model=_plan(*laps), tools=tools))
    return name


def _pay_tool(vendor: FakeVendor, kind: ToolKind = "idempotent", *, lookup: bool = False) -> Tool:
    @tool(kind=kind)
    def pay(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Pay through the vendor, passing the idempotency key."""
        return vendor.pay(ctx.idempotency_key, order_id=order_id, amount_cents=amount_cents)

    if lookup:
        pay.lookup(vendor.find)
    assert isinstance(pay, Tool)
    return pay


def _tool_results(w: InProcessWorker, run_id: str) -> list[str]:
    return [m.message.content for m in w.messages(run_id) if m.message.role == "tool"]


def test_applied_effect_is_reused_when_the_lap_is_replayed(worker: InProcessWorker) -> None:
    """The second call of the lap crashes; the retried lap must not pay again."""
    vendor = FakeVendor()
    flaky = {"left": 1}

    @tool
    def audit() -> str:
        """Fails once, after the payment of the same lap landed."""
        if flaky["left"]:
            flaky["left"] -= 1
            raise RuntimeError("audit service blip")
        return "ok"

    name = _agent(worker, [_pay_tool(vendor), audit],
                  [("pay", {"order_id": "o1", "amount_cents": 500}), ("audit", {})])
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=30)
    assert done.status == "succeeded", done.error_detail
    key = effect_key(run.id, 1, 0)
    assert vendor.calls == [key]
    [effect] = worker.effects(run.id)
    assert (effect.key, effect.status, effect.attempts) == (key, "applied", 1)
    assert json.loads(_tool_results(worker, run.id)[0]) == vendor.find(key)


def test_pending_effect_with_lookup_is_adopted(worker: InProcessWorker) -> None:
    """Died after the vendor applied it: lookup finds it, nothing is re-sent."""
    vendor = FakeVendor(honours_keys=False)
    vendor.crash = ["after"]
    name = _agent(worker, [_pay_tool(vendor, "compensatable", lookup=True)],
                  [("pay", {"order_id": "o1", "amount_cents": 700})])
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=30)
    assert done.status == "succeeded", done.error_detail
    key = effect_key(run.id, 1, 0)
    assert vendor.calls == [key] and vendor.by_key() == {key: 1}
    [effect] = worker.effects(run.id)
    assert (effect.status, effect.attempts) == ("applied", 2)
    assert effect.result == vendor.find(key)


def test_pending_effect_with_lookup_that_finds_nothing_is_called_again(
        worker: InProcessWorker) -> None:
    vendor = FakeVendor(honours_keys=False)
    vendor.crash = ["before"]
    name = _agent(worker, [_pay_tool(vendor, "compensatable", lookup=True)],
                  [("pay", {"order_id": "o1", "amount_cents": 700})])
    run = worker.start_run(name, "go")
    assert worker.wait(run.id, timeout=30).status == "succeeded"
    key = effect_key(run.id, 1, 0)
    assert vendor.calls == [key, key] and vendor.by_key() == {key: 1}


def test_pending_idempotent_effect_is_called_again_with_the_same_key(
        worker: InProcessWorker) -> None:
    vendor = FakeVendor()
    vendor.crash = ["after"]
    name = _agent(worker, [_pay_tool(vendor)],
                  [("pay", {"order_id": "o1", "amount_cents": 300})],
                  [("pay", {"order_id": "o2", "amount_cents": 400})])
    run = worker.start_run(name, "go")
    assert worker.wait(run.id, timeout=30).status == "succeeded"
    k1, k2 = effect_key(run.id, 1, 0), effect_key(run.id, 2, 0)
    assert vendor.calls == [k1, k1, k2]
    assert vendor.by_key() == {k1: 1, k2: 1}
    assert [(e.key, e.status) for e in worker.effects(run.id)] == [(k1, "applied"),
                                                                   (k2, "applied")]


@pytest.mark.parametrize("landed", [True, False])
def test_pending_effect_without_lookup_or_idempotency_waits_for_a_human(
        worker: InProcessWorker, landed: bool) -> None:
    """Never guess: the effect is marked unknown and the run waits; the human's
    verdict either adopts the payment or lets the call be made (once)."""
    vendor = FakeVendor(honours_keys=False)
    vendor.crash = ["after" if landed else "before"]
    name = _agent(worker, [_pay_tool(vendor, "compensatable")],
                  [("pay", {"order_id": "o1", "amount_cents": 900})])
    run = worker.start_run(name, "go")
    key = effect_key(run.id, 1, 0)
    worker.run_until_idle()
    paused = worker.get_run(run.id)
    assert (paused.status, paused.waiting_for, paused.error_code) == (
        "waiting", f"effect:{key}", "effect_unknown")
    [effect] = worker.effects(run.id)
    assert effect.status == "unknown" and "unknown" in (effect.error or "")
    assert any(e.kind == "effect_unknown" for e in worker.events(run.id))
    worker.run_until_idle()  # nothing re-sends a waiting run
    assert vendor.calls == [key]

    found = vendor.find(key)
    acting(worker, "ops@example.com").resolve_effect(key, applied=landed, result=found)
    done = worker.wait(run.id, timeout=30)
    assert done.status == "succeeded", done.error_detail
    assert vendor.by_key() == {key: 1}
    assert vendor.calls == ([key] if landed else [key, key])
    [effect] = worker.effects(run.id)
    assert effect.status == "applied"
    assert json.loads(_tool_results(worker, run.id)[0]) == vendor.find(key)
    resolved = [e for e in worker.events(run.id) if e.kind == "effect_resolved"]
    assert [e.data for e in resolved] == [{"key": key, "applied": landed,
                                           "by": "ops@example.com"}]


def test_same_key_with_different_arguments_fails_the_run(worker: InProcessWorker) -> None:
    """A deploy changed a default between two attempts of the lap: the replay
    would pay something else under the same key. Refused, and said why."""
    vendor = FakeVendor()
    vendor.crash = ["before"]

    def pay_tool(currency: str) -> Tool:
        @tool(kind="idempotent", name="pay")
        def pay(order_id: str, amount_cents: int, ctx: ToolContext,
                currency: str = currency) -> dict[str, Any]:
            """Pay in ``currency``."""
            return vendor.pay(ctx.idempotency_key, order_id=order_id,
                              amount_cents=amount_cents, currency=currency)

        assert isinstance(pay, Tool)
        return pay

    laps = [("pay", {"order_id": "o1", "amount_cents": 100})]
    _agent(worker, [pay_tool("usd")], laps)
    run = worker.start_run("fx", "go")
    assert worker.run_until_idle(max_laps=1) == 1  # first attempt: intent, then lost
    assert worker.get_run(run.id).error_message is not None
    _agent(worker, [pay_tool("eur")], laps)  # the "deploy"
    key = effect_key(run.id, 1, 0)
    # The failing run's payment is still pending and the tool has no lookup:
    # the ending never calls it again, so a human says whether it landed.
    paused = worker.wait(run.id, timeout=30, until=lambda r: r.status == "waiting")
    assert (paused.waiting_for, paused.ending) == (f"effect:{key}", "failed")
    acting(worker, "ops@example.com").resolve_effect(key, applied=False)
    done = worker.wait(run.id, timeout=30)
    assert done.status == "failed"
    assert done.error_code == "idempotency_conflict"
    assert key in (done.error_message or "") and "different arguments" in (
        done.error_message or "")
    assert vendor.calls == [key] and vendor.applied == []
    [effect] = worker.effects(run.id)
    assert effect.args["currency"] == "usd" and effect.status == "not_applied"


@pytest.mark.parametrize("approved", [True, False])
def test_irreversible_call_waits_for_a_recorded_approval(worker: InProcessWorker,
                                                          approved: bool) -> None:
    vendor = FakeVendor()
    wire = _pay_tool(vendor, "irreversible")
    name = _agent(worker, [wire], [("pay", {"order_id": "acct-9", "amount_cents": 50_000})])
    run = worker.start_run(name, "go")
    key = effect_key(run.id, 1, 0)
    worker.run_until_idle()
    paused = worker.get_run(run.id)
    [approval] = worker.list_approvals(run_id=run.id)
    assert (paused.status, paused.waiting_for) == ("waiting", f"approval:{approval.id}")
    assert (approval.effect_key, approval.tool_name, approval.arguments) == (
        key, "pay", {"order_id": "acct-9", "amount_cents": 50_000})
    assert vendor.calls == [] and worker.effects(run.id) == []
    worker.run_until_idle()
    assert vendor.calls == []

    if approved:
        acting(worker, "cfo@example.com").approve(run.id)
    else:
        acting(worker, "cfo@example.com").reject(run.id, comment="wrong account")
    done = worker.wait(run.id, timeout=30)
    assert done.status == "succeeded", done.error_detail
    if approved:
        assert vendor.by_key() == {key: 1}
        assert [(e.key, e.status) for e in worker.effects(run.id)] == [(key, "applied")]
    else:
        assert vendor.calls == [] and worker.effects(run.id) == []
        [result] = _tool_results(worker, run.id)
        assert "rejected by cfo@example.com" in result and "wrong account" in result


def _saga_tools(vendor: FakeVendor, undone: list[str], *, undo_fails: bool = False
                ) -> list[Tool]:
    tools: list[Tool] = []
    for name in ("flight", "hotel"):
        @tool(kind="compensatable", name=name)
        def book(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
            """A saga step."""
            return vendor.pay(ctx.idempotency_key, order_id=order_id, amount_cents=amount_cents)

        @book.compensator
        def undo(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
            if undo_fails:
                raise ConnectionError("the vendor's refund endpoint is down")
            undone.append(ctx.idempotency_key)
            return {"undone": args["order_id"]}

        tools.append(book)

    @tool
    def car() -> None:
        """The third step: always fails (not a ToolError), so the run fails."""
        raise RuntimeError("no cars left")

    return [*tools, car]


def test_saga_compensates_in_reverse_order_once(worker: InProcessWorker) -> None:
    vendor, undone = FakeVendor(), list[str]()
    name = _agent(worker, _saga_tools(vendor, undone),
                  [("flight", {"order_id": "f1", "amount_cents": 100})],
                  [("hotel", {"order_id": "h1", "amount_cents": 200})],
                  [("car", {})])
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=30)
    assert done.status == "failed" and "no cars left" in (done.error_message or "")
    k1, k2 = effect_key(run.id, 1, 0), effect_key(run.id, 2, 0)
    assert undone == [compensation_key(k2), compensation_key(k1)]
    status = {e.key: e.status for e in worker.effects(run.id)}
    assert status == {k1: "compensated", k2: "compensated", compensation_key(k1): "applied",
                      compensation_key(k2): "applied"}
    worker.run_until_idle()
    assert len(undone) == 2


def test_compensation_that_keeps_failing_ends_the_run(worker: InProcessWorker) -> None:
    """An undo that never succeeds must not loop for ever: after the attempt
    limit the run fails with ``compensation_failed`` and the effect stays applied
    (for a human to handle)."""
    vendor, undone = FakeVendor(), list[str]()
    name = _agent(worker, _saga_tools(vendor, undone, undo_fails=True),
                  [("flight", {"order_id": "f1", "amount_cents": 100})],
                  [("car", {})])
    run = worker.start_run(name, "go")
    laps = worker.run_until_idle(max_laps=50)
    done = worker.get_run(run.id)
    assert done.status == "failed", (done.status, laps)
    assert done.error_code == "compensation_failed"
    assert laps < 50
    k1 = effect_key(run.id, 1, 0)
    status = {e.key: e.status for e in worker.effects(run.id)}
    # The undo's outcome is not known: the final ledger says so, and so does the run.
    assert status == {k1: "applied", compensation_key(k1): "unknown"}
    assert compensation_key(k1) in (done.error_message or "")
