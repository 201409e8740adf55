"""Where a lap meets something else happening at the same time, or an operator
verb meets history: each test reproduces one reported bug, in
process, on SQLite and on a fresh real Postgres database.

A race is staged by wrapping one store read of the lap so that the competing
verb runs right after it, exactly where a concurrent caller would land.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.control import wait_for_signal_tool
from agent_worker.core.constants import effect_key
from agent_worker.core.errors import (
    AgentDefinitionError,
    AlreadyDecidedError,
    InvalidStateError,
    MalformedModelOutputError,
    ReplayRefusedError,
)
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.lap import run_lap
from agent_worker.model.scripted import model_turns
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from agent_worker.tools import Tool, ToolContext
from tests.engine.conftest import OwnRunsWorker
from tests.principals import acting


class Vendor:
    """A booking vendor that does not honour idempotency keys: what really
    happened, per key. ``crash`` scripts the next calls: ``"after"`` books and
    then loses the reply (a worker killed right after the vendor booked),
    ``"before"`` loses the request."""

    def __init__(self) -> None:
        self.booked: Counter[str] = Counter()
        self.released: Counter[str] = Counter()
        self.crash: list[str] = []

    def book(self, key: str, item: str) -> dict[str, str]:
        mode = self.crash.pop(0) if self.crash else None
        if mode == "before":
            raise ConnectionResetError("request lost before the vendor saw it")
        self.booked[key] += 1
        if mode == "after":
            raise ConnectionResetError("reply lost after the vendor booked")
        return {"booking": f"bk-{key}", "item": item}

    def find(self, key: str) -> dict[str, str] | None:
        return {"booking": f"bk-{key}"} if self.booked[key] else None

    def release(self, key: str) -> dict[str, str]:
        self.released[key] += 1
        return {"released": key}

    def standing(self) -> dict[str, int]:
        """Bookings still in place."""
        return {k: n - self.released[k] for k, n in self.booked.items()
                if n - self.released[k] > 0}


def _booking_tool(vendor: Vendor, *, lookup: bool) -> Tool:
    @tool(kind="compensatable")
    def book(item: str, ctx: ToolContext) -> dict[str, str]:
        """Book an item; undone by releasing it."""
        return vendor.book(ctx.idempotency_key, item)

    @book.compensator
    def _release(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, str]:
        return vendor.release(ctx.idempotency_key.removesuffix(":undo"))

    if lookup:
        book.lookup(vendor.find)
    return book


@tool
def note(text: str) -> str:
    """A read step."""
    return text


@tool(kind="irreversible")
def wire(amount: int) -> str:
    """Irreversible: a human approves every call."""
    return f"wired {amount}"


def _plan_model() -> ScriptedModel:
    """Model turn k makes the calls of ``plan[k]`` (a list of ``[tool, args]``),
    then answers; ``"malformed"`` makes that turn's output unreadable."""

    def script(r: ModelRequest) -> ModelResponse:
        plan: list[Any] = json.loads(next(m for m in r.messages if m.role == "user").content)
        k = model_turns(r)
        if k >= len(plan):
            return turn("done")
        if plan[k] == "malformed":
            raise MalformedModelOutputError("unreadable model output")
        return turn(f"turn {k}", [tuple(c) for c in plan[k]])

    return ScriptedModel(script)


@pytest.fixture
def w(dialect_url: str, agent_registry: Registry) -> Iterator[InProcessWorker]:
    # Only this test's runs: on Postgres the sweeps would also find other
    # tests' leftovers due (was: ``run_until_idle() == 0`` failed now and then).
    worker = OwnRunsWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = agent_registry
    yield worker
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def _register(w: InProcessWorker, *tools: Tool, name: str = "lc", version: str = "1",
              **kw: Any) -> Agent:
    return w.rt.registry.register(Agent(name=name, version=version, model=_plan_model(),
                                        tools=[note, wait_for_signal_tool, *tools], **kw))


def _start(w: InProcessWorker, plan: list[Any], name: str = "lc") -> str:
    return w.start_run(name, plan).id


def _after(obj: Any, method: str, then: Callable[[], Any],
           monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``obj.method`` call ``then()`` once, right after its first read."""
    real = getattr(obj, method)
    fired: list[bool] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value = real(*args, **kwargs)
        if not fired:
            fired.append(True)
            then()
        return value

    monkeypatch.setattr(obj, method, wrapped)


def _tool_results(w: InProcessWorker, run_id: str) -> list[str]:
    return [m.message.content for m in w.messages(run_id) if m.message.role == "tool"]


# --- 1: lost wake-ups -----------------------------------------------------------------


def test_a_signal_sent_while_the_lap_decides_to_wait_wakes_the_run(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 1: the signal lands after the lap looked for it and before the lap
    committed `waiting`; the run must not wait for ever."""
    _register(w)
    run_id = _start(w, [[["wait_for_signal", {"name": "go"}]]])
    _after(w.rt.store, "pending_signals", lambda: w.send_signal(run_id, "go", {"n": 1}),
           monkeypatch)
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "succeeded", (run.status, run.waiting_for)
    assert json.loads(_tool_results(w, run_id)[0])["payload"] == {"n": 1}


def test_an_approval_decided_while_the_lap_decides_to_wait_wakes_the_run(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 1, approvals: an operator's `retry` re-runs a lap that finds its
    approval still pending; the approval is decided right after that read."""
    _register(w, wire)
    run_id = _start(w, [[["wire", {"amount": 5}]]])
    w.run_until_idle()
    assert w.get_run(run_id).waiting_for is not None
    acting(w, "ops").retry(run_id)
    _after(w.rt.store, "approval_for", lambda: acting(w, "alice").approve(run_id), monkeypatch)
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "succeeded", (run.status, run.waiting_for)
    assert "wired 5" in _tool_results(w, run_id)[0]


# --- 12: a cancel during a lap's last attempt ---------------------------------------------


def test_a_cancel_during_the_last_attempt_gets_fresh_attempts_and_compensates(
        w: InProcessWorker) -> None:
    """Bug 12: the lap is on its last allowed attempt when the cancel arrives;
    the ending must not inherit that count (it used to end `failed` with
    "compensation kept failing" and the booking in place)."""
    vendor = Vendor()
    attempts = {"n": 0}
    run_id = ""

    @tool
    def flaky() -> str:
        """Fails until its last attempt, during which the run is cancelled."""
        attempts["n"] += 1
        if attempts["n"] < w.rt.settings.max_lap_attempts:
            raise RuntimeError("flaky service")
        acting(w, "carol").cancel(run_id, reason="customer withdrew")
        return "ok"

    _register(w, _booking_tool(vendor, lookup=False), flaky)
    run_id = _start(w, [[["book", {"item": "room"}]], [["flaky", {}]]])
    w.run_until_idle()
    run = w.get_run(run_id)
    assert attempts["n"] == w.rt.settings.max_lap_attempts
    assert (run.status, run.cancelled_by) == ("cancelled", "carol"), run.error_message
    assert vendor.standing() == {}, "the booking was compensated"
    assert [e.status for e in w.effects(run_id)] == ["compensated", "applied"]


# --- 11: cancel with a compensatable effect of unknown outcome ---------------------------


@pytest.mark.parametrize("landed", [True, False])
def test_cancel_reconciles_a_pending_effect_through_its_lookup(
        w: InProcessWorker, landed: bool) -> None:
    """Bug 11: the worker died right after the vendor booked (or before the
    request reached it), then the run is cancelled: the lookup decides; a
    booking that landed is released, one that did not is recorded as such."""
    vendor = Vendor()
    vendor.crash = ["after" if landed else "before"]
    _register(w, _booking_tool(vendor, lookup=True))
    run_id = _start(w, [[["book", {"item": "room"}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle(max_laps=1)
    assert [(e.key, e.status) for e in w.effects(run_id)] == [(key, "pending")]
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "cancelled", (run.status, run.waiting_for, run.error_message)
    assert vendor.standing() == {}
    statuses = {e.key: e.status for e in w.effects(run_id)}
    if landed:
        assert vendor.released == {key: 1}
        assert statuses == {key: "compensated", f"{key}:undo": "applied"}
    else:
        assert vendor.released == {} and statuses == {key: "not_applied"}


def test_cancel_waits_for_a_human_on_a_pending_effect_without_lookup(
        w: InProcessWorker) -> None:
    """Bug 11: no lookup, so nobody but a human knows whether the booking
    landed; the cancel must wait on that effect, not end with it in place."""
    vendor = Vendor()
    vendor.crash = ["after"]
    _register(w, _booking_tool(vendor, lookup=False))
    run_id = _start(w, [[["book", {"item": "room"}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle(max_laps=1)
    acting(w, "carol").cancel(run_id, reason="stop")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.waiting_for) == ("waiting", f"effect:{key}")
    assert [e.status for e in w.effects(run_id)] == ["unknown"]
    assert w.run_until_idle() == 0, "nothing re-runs a run waiting for a human"
    acting(w, "ops@example.com").resolve_effect(key, applied=True, result=vendor.find(key))
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.cancel_reason) == ("cancelled", "stop")
    assert vendor.standing() == {} and vendor.released == {key: 1}


# --- 3, 5: retry and fork respect history -----------------------------------------------


def test_retry_refuses_a_run_whose_effects_were_compensated(w: InProcessWorker) -> None:
    """Bug 3: the run failed and its booking was released; a retry would
    resume as if the booking still stood."""
    vendor = Vendor()
    _register(w, _booking_tool(vendor, lookup=True))
    run_id = _start(w, [[["book", {"item": "room"}]], "malformed"])
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "failed" and vendor.standing() == {}
    with pytest.raises(ReplayRefusedError, match=r"compensated.*fork"):
        acting(w, "ops").retry(run_id)
    assert w.get_run(run_id).status == "failed"
    assert not any(e.kind == "retried" for e in w.events(run_id))
    # A fork from before the booking starts clean, under its own keys.
    forked = w.fork(run_id, 0)
    assert forked.parent_run_id == run_id


def test_retry_and_fork_refuse_a_run_whose_history_was_pruned(w: InProcessWorker) -> None:
    """Bug 5: retention deleted the run's messages and ledger; a retry (or a
    fork) would re-run from an empty history and repeat the booking."""
    vendor = Vendor()
    _register(w, _booking_tool(vendor, lookup=True), name="lc-pruned", retention="shallow")
    run_id = _start(w, [[["note", {"text": "a"}]], "malformed"], name="lc-pruned")
    w.run_until_idle()
    run = w.get_run(run_id)
    assert run.status == "failed"
    later = datetime.now(UTC) + timedelta(days=1)
    w.rt.store.prune(checkpoints_before=later, ledger_before=later, batch=1000)
    assert w.messages(run_id) == []
    with pytest.raises(ReplayRefusedError, match="pruned"):
        acting(w, "ops").retry(run_id)
    with pytest.raises(ReplayRefusedError, match="pruned"):
        w.fork(run_id, run.lap)
    with pytest.raises(ReplayRefusedError, match="pruned"):
        w.fork(run_id, 0)
    assert w.get_run(run_id).status == "failed"


# --- 4: effects resolve -----------------------------------------------------------------


def test_resolve_refuses_an_effect_still_in_flight_and_keeps_the_verdict(
        w: InProcessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 4: a pending effect with a live lease may be landing right now;
    resolving it (which deleted the row) made a replay call the vendor twice.
    Only an unknown effect of a run waiting on it is resolved, and the row stays."""
    vendor = Vendor()
    vendor.crash = ["before"]
    refused: list[BaseException] = []
    _register(w, _booking_tool(vendor, lookup=False))
    run_id = _start(w, [[["book", {"item": "room"}]]])
    key = effect_key(run_id, 1, 0)

    def resolve_mid_flight() -> None:
        try:
            acting(w, "mallory").resolve_effect(key, applied=False)
        except InvalidStateError as e:
            refused.append(e)

    # Right after the intent is committed, while the lap holds its lease.
    _after(w.rt.store, "begin_effect", resolve_mid_flight, monkeypatch)
    w.run_until_idle(max_laps=1)
    assert len(refused) == 1 and isinstance(refused[0], AlreadyDecidedError)
    assert [e.status for e in w.effects(run_id)] == ["pending"]
    w.run_until_idle()
    run = w.get_run(run_id)
    assert (run.status, run.waiting_for) == ("waiting", f"effect:{key}")
    acting(w, "ops@example.com").resolve_effect(key, applied=False)
    [effect] = w.effects(run_id)
    assert effect.status == "not_applied"
    assert "not applied by ops@example.com at " in (effect.error or "")
    with pytest.raises(AlreadyDecidedError):
        acting(w, "ops@example.com").resolve_effect(key, applied=True)
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    assert vendor.booked == {key: 1}, "called again once, under the same key"
    [effect] = w.effects(run_id)
    assert (effect.status, effect.attempts) == ("applied", 3)


def test_resolve_refuses_an_unknown_effect_the_run_does_not_wait_on(
        w: InProcessWorker) -> None:
    vendor = Vendor()
    vendor.crash = ["after"]
    _register(w, _booking_tool(vendor, lookup=False))
    run_id = _start(w, [[["book", {"item": "room"}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle()
    assert w.get_run(run_id).waiting_for == f"effect:{key}"
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:  # the run moved on (e.g. a raced retry)
        c.execute(update(runs).where(runs.c.id == run_id).values(status="queued",
                                                                  waiting_for=None))
    with pytest.raises(InvalidStateError, match="not waiting on effect"):
        acting(w, "ops@example.com").resolve_effect(key, applied=True)
    assert [e.status for e in w.effects(run_id)] == ["unknown"]


# --- 6: irreversible tools are never auto-approved -------------------------------------


def test_irreversible_tools_cannot_be_auto_approved() -> None:
    """Bug 6: the sweeper would have approved the wire as system:timeout."""
    with pytest.raises(AgentDefinitionError, match=r"irreversible tools \['wire'\]"):
        Agent(name="auto", model=_plan_model(), tools=[wire], on_approval_timeout="approve")
    Agent(name="auto", model=_plan_model(), tools=[wire], on_approval_timeout="escalate",
          escalate_to="lead")


# --- 9: a tool removed while a call of it is recorded ----------------------------------


@pytest.mark.parametrize("crash", ["after_outcome", "after_apply"])
def test_a_removed_tool_is_reconciled_from_the_ledger(
        w: InProcessWorker, crash: str) -> None:
    """Bug 9: a deploy removed `book` while a lap had recorded a call of it.
    Applied: its result is reused; pending: a human decides. Never "unknown tool"."""
    vendor = Vendor()
    book = _booking_tool(vendor, lookup=False)

    audit_down = [True]

    @tool
    def audit() -> str:
        """Fails once, after the booking of the same lap was recorded."""
        if audit_down.pop() if audit_down else False:
            raise RuntimeError("audit service down")
        return "audited"

    if crash == "after_apply":
        vendor.crash = ["after"]
    _register(w, book, audit)
    run_id = _start(w, [[["book", {"item": "room"}], ["audit", {}]]])
    key = effect_key(run_id, 1, 0)
    w.run_until_idle(max_laps=1)
    status = "applied" if crash == "after_outcome" else "pending"
    assert [e.status for e in w.effects(run_id)] == [status]
    _register(w, audit)  # the deploy: the same agent version without `book`
    w.run_until_idle()
    run = w.get_run(run_id)
    if crash == "after_apply":
        assert (run.status, run.waiting_for) == ("waiting", f"effect:{key}")
        assert [e.status for e in w.effects(run_id)] == ["unknown"]
        acting(w, "ops@example.com").resolve_effect(key, applied=True, result=vendor.find(key))
        w.run_until_idle()
        run = w.get_run(run_id)
    assert run.status == "succeeded", run.error_message
    first = _tool_results(w, run_id)[0]
    assert "Unknown tool" not in first and f"bk-{key}" in first
    assert vendor.booked == {key: 1}


# --- 2: a migrated run is never claimed by older code ----------------------------------


def test_a_migrating_lap_moves_the_pin_and_old_code_cannot_claim_the_run(
        w: InProcessWorker, dialect_url: str) -> None:
    """Bug 2: v2 (resumes v1) migrates the checkpoint; the run must be pinned
    to v2 and its next laps sent to v2's queue, and a v1 worker receiving a
    lap of it (a late or duplicate message) must not claim it."""
    _register(w, version="1")
    run_id = _start(w, [[["note", {"text": f"n{i}"}]] for i in range(4)])
    queue = w.queue
    v1_lap = queue.pending.popleft()
    assert run_lap(w.rt, v1_lap.run_id, v1_lap.lap) == "committed"

    new = InProcessWorker(dialect_url, retry_backoff_seconds=0)
    try:
        new.rt.registry = Registry()
        new.rt.registry.register(Agent(name="lc", version="2", model=_plan_model(),
                                       tools=[note, wait_for_signal_tool], resumes=("1",)))
        sent = queue.pending.popleft()
        assert sent.agent_version == "1"
        assert run_lap(new.rt, sent.run_id, sent.lap) == "committed"
        assert new.get_run(run_id).agent_version == "2"
        assert [(d.lap, d.agent_version) for d in new.queue.pending] == [(3, "2")]
        # The old worker gets lap 3 anyway (a duplicate on the old queue): no claim.
        assert run_lap(w.rt, run_id, 3) in ("skipped", "unserved")
        assert w.get_run(run_id).lap_attempts == 0
        new.run_until_idle()
        done = new.get_run(run_id)
        assert done.status == "succeeded"
        versions = [new.state_at(run_id, lap).agent_version for lap in range(done.lap + 1)]
        assert versions == ["1", "1"] + ["2"] * (done.lap - 1)
    finally:
        store = new.rt.store
        assert isinstance(store, SqlStore)
        store.dispose()
