"""Parallel tool calls (engine.parallel), in process on SQLite and Postgres.

Overlap is proved structurally, never with a wall-clock threshold: calls that
must run together meet at a ``threading.Barrier`` (which breaks, failing the
call, if they ran one after another), and a call that must run alone checks
that nothing else is in flight.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent
from agent_worker.core.constants import effect_key
from agent_worker.core.errors import AgentDefinitionError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.tools import Tool, ToolContext
from tests.principals import acting

Calls = list[tuple[str, dict[str, Any]]]


class InFlight:
    """Counts calls in flight; remembers the most at once and each call's order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.started: list[str] = []
        self.finished: list[str] = []

    def enter(self, name: str) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.started.append(name)
            return self.now

    def leave(self, name: str) -> None:
        with self.lock:
            self.now -= 1
            self.finished.append(name)


@pytest.fixture
def worker(bare_worker: InProcessWorker) -> InProcessWorker:
    return bare_worker


def _agent(w: InProcessWorker, tools: list[Tool], *laps: Calls, **options: Any) -> str:
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > len(laps):
            return turn("done")
        return turn(f"lap {r.lap}", laps[r.lap - 1])

    w.rt.registry.register(Agent(name="par", model=ScriptedModel(script), tools=tools,
                                 approval_owner="ops", **options))
    return "par"


def _results(w: InProcessWorker, run_id: str) -> list[tuple[str | None, str, bool]]:
    return [(m.message.tool_call_id, m.message.content, m.message.is_error)
            for m in w.messages(run_id) if m.message.role == "tool"]


def _asked(w: InProcessWorker, run_id: str) -> list[str]:
    return [c.id for m in w.messages(run_id) if m.message.role == "assistant"
            for c in m.message.tool_calls]


def test_the_calls_of_a_turn_overlap_and_answer_in_the_models_order(
        worker: InProcessWorker) -> None:
    """Five idempotent calls meet at a barrier (all five in flight at once) and
    finish in reverse order; the model reads the results in the order it asked,
    each call with its own ledger row and key."""
    meet = threading.Barrier(5, timeout=10)
    finish_order: list[int] = []
    gates = [threading.Event() for _ in range(5)]

    @tool(kind="idempotent")
    def pay(n: int, ctx: ToolContext) -> dict[str, Any]:
        """Waits for all five, then finishes after the call asked after it."""
        meet.wait()
        if n < 4:
            gates[n + 1].wait(timeout=10)
        finish_order.append(n)
        gates[n].set()
        return {"n": n, "key": ctx.idempotency_key}

    name = _agent(worker, [pay], [("pay", {"n": i}) for i in range(5)])
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error_detail
    assert finish_order == [4, 3, 2, 1, 0]
    results = _results(worker, run.id)
    assert [r[0] for r in results] == _asked(worker, run.id)
    keys = [effect_key(run.id, 1, i) for i in range(5)]
    assert [json.loads(r[1]) for r in results] == [{"n": i, "key": keys[i]} for i in range(5)]
    assert sorted((e.key, e.status, e.attempts) for e in worker.effects(run.id)) == sorted(
        (k, "applied", 1) for k in keys)
    # Each call's own duration is in the lap's trace (runs show --laps prints it).
    [commit] = [e for e in worker.events(run.id) if e.kind == "lap_committed" and e.lap == 1]
    marks = [t for t in (commit.data or {})["trace"] if t["step"] == "tool"]
    assert len(marks) == 5 and all(m["call_ms"] > 0 for m in marks)


def test_a_tool_declared_not_parallel_runs_alone_between_the_others(
        worker: InProcessWorker) -> None:
    """[a, b, solo, c, d]: a and b overlap, then solo runs with nothing else in
    flight, then c and d overlap; the barrier call is a fence both ways."""
    flight = InFlight()
    pairs = {"ab": threading.Barrier(2, timeout=10), "cd": threading.Barrier(2, timeout=10)}

    @tool
    def fetch(name: str, pair: str) -> str:
        """Overlaps with its pair."""
        flight.enter(name)
        pairs[pair].wait()
        flight.leave(name)
        return name

    @tool(parallel=False)
    def solo() -> int:
        """Must run alone."""
        alone = flight.enter("solo")
        flight.leave("solo")
        return alone

    name = _agent(worker, [fetch, solo],
                  [("fetch", {"name": "a", "pair": "ab"}), ("fetch", {"name": "b", "pair": "ab"}),
                   ("solo", {}),
                   ("fetch", {"name": "c", "pair": "cd"}), ("fetch", {"name": "d", "pair": "cd"})])
    run = worker.start_run(name, "go")
    assert worker.wait(run.id, timeout=60).status == "succeeded"
    assert [r[1] for r in _results(worker, run.id)] == ["a", "b", "1", "c", "d"]
    assert set(flight.started[:2]) == {"a", "b"} and flight.started[2] == "solo"
    assert set(flight.finished[:2]) == {"a", "b"} and flight.finished[2] == "solo"
    assert flight.most == 2


def test_max_parallel_calls_bounds_how_many_run_at_once(worker: InProcessWorker) -> None:
    flight = InFlight()
    two = threading.Barrier(2, timeout=10)

    @tool
    def fetch(n: int) -> int:
        """Meets one other call."""
        flight.enter(str(n))
        two.wait()
        flight.leave(str(n))
        return n

    name = _agent(worker, [fetch], [("fetch", {"n": i}) for i in range(6)],
                  max_parallel_calls=2)
    run = worker.start_run(name, "go")
    assert worker.wait(run.id, timeout=60).status == "succeeded"
    assert flight.most == 2
    assert [r[1] for r in _results(worker, run.id)] == [str(i) for i in range(6)]


def test_a_call_that_needs_approval_fences_the_turn(worker: InProcessWorker) -> None:
    """[pay a, pay b, close, pay c]: a and b land, the run waits for the human
    with c not yet called; after the approval close runs, then c."""
    paid: Counter[str] = Counter()

    @tool(kind="idempotent")
    def pay(order: str, ctx: ToolContext) -> str:
        """Counted per order."""
        paid[order] += 1
        return order

    @tool(kind="irreversible")
    def close(account: str) -> str:
        """Needs a human."""
        return f"closed {account}"

    name = _agent(worker, [pay, close], [("pay", {"order": "a"}), ("pay", {"order": "b"}),
                                         ("close", {"account": "x"}), ("pay", {"order": "c"})])
    run = worker.start_run(name, "go")
    worker.run_until_idle()
    waiting = worker.get_run(run.id)
    assert waiting.status == "waiting" and (waiting.waiting_for or "").startswith("approval:")
    assert paid == {"a": 1, "b": 1}
    acting(worker, "alice").approve(run.id)
    done = worker.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error_detail
    assert paid == {"a": 1, "b": 1, "c": 1}
    results = _results(worker, run.id)
    assert [r[0] for r in results] == _asked(worker, run.id)
    assert [r[1] for r in results][:2] == ["a", "b"] and results[3][1] == "c"
    assert "closed x" in results[2][1]


def test_an_error_in_one_call_replays_only_what_did_not_land(
        worker: InProcessWorker) -> None:
    """One call crashes (not a ToolError: like a worker dying mid-call) while the
    others of its turn land; the retried lap reuses the landed ones from the
    ledger and calls only the crashed one again. A ToolError in another call is
    that call's own result."""
    calls: Counter[int] = Counter()
    crash = {"left": 1}

    @tool(kind="idempotent")
    def pay(n: int, ctx: ToolContext) -> int:
        """Call 2 crashes once; call 4 is refused (a tool error)."""
        calls[n] += 1
        if n == 2 and crash["left"]:
            crash["left"] -= 1
            raise ConnectionResetError("connection reset mid-call")
        if n == 4:
            from agent_worker.core.errors import ToolError
            raise ToolError("card declined")
        return n

    name = _agent(worker, [pay], [("pay", {"n": i}) for i in range(5)])
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error_detail
    assert calls == {0: 1, 1: 1, 2: 2, 3: 1, 4: 1}
    results = _results(worker, run.id)
    assert [(r[1], r[2]) for r in results] == [("0", False), ("1", False), ("2", False),
                                              ("3", False), ("card declined", True)]
    status = {e.key: (e.status, e.attempts) for e in worker.effects(run.id)}
    assert status[effect_key(run.id, 1, 2)] == ("applied", 2)
    assert status[effect_key(run.id, 1, 0)] == ("applied", 1)
    assert status[effect_key(run.id, 1, 4)] == ("failed", 1)


def test_max_parallel_calls_is_validated() -> None:
    with pytest.raises(AgentDefinitionError, match="max_parallel_calls"):
        Agent(name="bad", model=ScriptedModel(lambda r: turn("x")), max_parallel_calls=0)
    with pytest.raises(AgentDefinitionError, match="max_parallel_calls"):
        Agent(name="bad", model=ScriptedModel(lambda r: turn("x")),
              max_parallel_calls=True)


def test_a_cancel_seen_mid_turn_stops_the_calls_not_yet_started(
        worker: InProcessWorker) -> None:
    """Two at a time of four: call 0 cancels the run and heartbeats (which
    learns of the cancel); call 1 is already running and finishes; calls 2 and
    3 check the lease before starting and never run. The run ends cancelled."""
    ran: list[int] = []
    returned: dict[str, int] = {}
    both = threading.Barrier(2, timeout=10)
    seen = threading.Event()

    # What really happened, by key: the ending settles call 0 (stopped
    # mid-call, so pending) by asking, and never calls it again.
    @tool(kind="idempotent", lookup=returned.get)
    def work(n: int, ctx: ToolContext) -> int:
        """Call 0 cancels its own run."""
        ran.append(n)
        if n < 2:
            both.wait()
        if n == 0:
            acting(worker, "ops").cancel(ctx.run_id, reason="stop")
            seen.wait(1.1)  # past the heartbeat's throttle, so it renews now
            try:
                ctx.heartbeat()
            finally:
                seen.set()
        else:
            seen.wait(10)
        returned[ctx.idempotency_key] = n
        return n

    name = _agent(worker, [work], [("work", {"n": i}) for i in range(4)],
                  max_parallel_calls=2)
    run = worker.start_run(name, "go")
    done = worker.wait(run.id, timeout=60)
    assert done.status == "cancelled"
    assert sorted(ran) == [0, 1]
