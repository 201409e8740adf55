"""A model-based test of the run lifecycle: hypothesis drives a real
Postgres store and the real lap engine, in process, through random
interleavings of laps and crashes at the protocol's fault points, duplicate,
late and lost deliveries, signals, approvals and rejections, cancels, retries,
forks, effect resolutions, sweeps, clock jumps, retention pruning and a deploy
of a new agent version; after every step it checks the invariants of
DESIGN.md, and at the end that every run can still be finished.

A crash is a ``Crash`` (a ``BaseException``, so the lap cannot catch it)
raised at a fault point: the lap stops there with its lease held, exactly as
when its worker is SIGKILLed. The outside world is one fake vendor that counts
what really happened per idempotency key.

CI runs ``AGENT_WORKER_MODEL_EXAMPLES`` (default 200) examples; a soak runs
thousands of new ones: ``AGENT_WORKER_MODEL_EXAMPLES=5000 AGENT_WORKER_MODEL_RANDOM=1
python -m pytest -p no:cacheprovider -o timeout=0 tests/engine/test_lifecycle_model.py``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import func, select, text

from agent_worker import InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.control import sleep_tool, wait_for_signal_tool
from agent_worker.core.clock import ManualClock
from agent_worker.core.errors import AgentWorkerError, MalformedModelOutputError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.lap import run_lap
from agent_worker.model.scripted import model_turns
from agent_worker.store.base import TERMINAL, ApprovalRecord, DueLap
from agent_worker.store.db import make_engine
from agent_worker.store.rows import effects, events, runs
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext
from tests.principals import acting
from tests.store_helpers import end_unfinished_runs

EXAMPLES = int(os.environ.get("AGENT_WORKER_MODEL_EXAMPLES", "200"))
STORE_POINTS = ("after_claim", "after_model_journal", "after_outcome", "after_commit")
TOOL_POINTS = ("before_apply", "after_apply", "tool_error")


class Crash(BaseException):
    """The worker died here (a BaseException: nothing in the lap catches it)."""


class World:
    """The fake vendor and the armed fault, shared by the tools and the store."""

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()
        self.released: Counter[str] = Counter()
        self.kinds: dict[str, str] = {}
        #: (run, turn) of "glitch" turns whose model output was already unreadable once.
        self.glitched: set[tuple[str, int]] = set()
        self.armed: str | None = None
        #: An operator verb that lands in the middle of the next lap, right
        #: after the named store read: (read, verb).
        self.meddle: tuple[str, Any] | None = None

    def during(self, read: str) -> None:
        if self.meddle is not None and self.meddle[0] == read:
            verb, self.meddle = self.meddle[1], None
            verb()

    def fire(self, point: str) -> None:
        if self.armed == point:
            self.armed = None
            if point == "tool_error":
                raise RuntimeError("the vendor answered 503")
            raise Crash(point)

    def apply(self, key: str, kind: str) -> dict[str, str]:
        self.kinds[key] = kind
        self.fire("before_apply")
        self.fire("tool_error")
        if not (kind == "idempotent" and self.applied[key]):
            self.applied[key] += 1
        self.fire("after_apply")
        return {"id": f"v-{key}"}

    def find(self, key: str) -> dict[str, str] | None:
        return {"id": f"v-{key}"} if self.applied[key] else None

    def release(self, key: str) -> dict[str, str]:
        original = key.removesuffix(":undo")
        if not self.released[original]:
            self.released[original] += 1
        return {"released": original}


WORLD = World()


@tool(kind="idempotent")
def pay(amount: int, ctx: ToolContext) -> dict[str, str]:
    """Idempotent: the vendor honours the key."""
    return WORLD.apply(ctx.idempotency_key, "idempotent")


@tool(kind="compensatable", lookup=lambda key: WORLD.find(key))
def book(item: int, ctx: ToolContext) -> dict[str, str]:
    """Not idempotent, has a lookup, undone by a release."""
    return WORLD.apply(ctx.idempotency_key, "compensatable")


@tool(kind="compensatable")
def charge(item: int, ctx: ToolContext) -> dict[str, str]:
    """Not idempotent, no lookup: a crash mid-call needs a human."""
    return WORLD.apply(ctx.idempotency_key, "compensatable")


@tool(kind="irreversible")
def wire(amount: int, ctx: ToolContext) -> dict[str, str]:
    """Irreversible: approved by a human first; no lookup."""
    return WORLD.apply(ctx.idempotency_key, "irreversible")


def _undo(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, str]:
    return WORLD.release(ctx.idempotency_key)


book.compensator(_undo)
charge.compensator(_undo)


@tool
def note(text: str) -> str:
    """A read."""
    return text


def _script(r: ModelRequest) -> ModelResponse:
    plan: list[Any] = json.loads(next(m for m in r.messages if m.role == "user").content)
    k = model_turns(r)
    if k >= len(plan):
        return turn("done")
    if plan[k] == "glitch":
        # Unreadable once (the run fails and compensates), fine on a retry.
        if (r.run_id, k) not in WORLD.glitched:
            WORLD.glitched.add((r.run_id, k))
            raise MalformedModelOutputError("unreadable model output")
        return turn(f"turn {k}", [("note", {"text": "after the glitch"})])
    return turn(f"turn {k}", [tuple(c) for c in plan[k]])


V1 = Agent(name="model-run", version="1", model=ScriptedModel(_script),
           tools=[pay, book, charge, wire, note, sleep_tool, wait_for_signal_tool],
           window_messages=500, approval_timeout=timedelta(hours=1))
V2 = replace(V1, version="2", resumes=("1",))

CALLS = st.one_of(
    st.builds(lambda a: ["pay", {"amount": a}], st.integers(1, 3)),
    st.builds(lambda a: ["book", {"item": a}], st.integers(1, 3)),
    st.builds(lambda a: ["charge", {"item": a}], st.integers(1, 3)),
    st.builds(lambda a: ["wire", {"amount": a}], st.integers(1, 3)),
    st.just(["note", {"text": "x"}]),
    st.just(["sleep", {"seconds": 30}]),
    st.builds(lambda n, t: ["wait_for_signal", {"name": n, "timeout_seconds": t}],
              st.sampled_from(["a", "b"]), st.sampled_from([600, None])),
)
TURNS = st.one_of(st.lists(CALLS, min_size=1, max_size=2), st.just("glitch"))
PLANS = st.lists(TURNS, min_size=1, max_size=4)


#: Where in a lap an operator's act can land, and the acts that matter there.
MEDDLING: dict[str, tuple[str, ...]] = {
    "after_claim": ("cancel", "retry", "signal", "approve"),
    "signals_read": ("signal",),
    "approval_read": ("approve", "reject", "cancel"),
    "after_intent": ("resolve", "cancel"),
    "after_outcome": ("cancel", "resolve"),
}


class FaultyStore:
    """The real store, with the armed crash raised right after the named step."""

    def __init__(self, inner: SqlStore) -> None:
        self.inner = inner
        self.shifts = _shifts_database_time(inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _then(self, point: str, value: Any) -> Any:
        WORLD.during(point)
        WORLD.fire(point)
        return value

    def claim(self, *a: Any, **k: Any) -> Any:
        return self._then("after_claim", self.inner.claim(*a, **k))

    def pending_signals(self, *a: Any, **k: Any) -> Any:
        return self._then("signals_read", self.inner.pending_signals(*a, **k))

    def approval_for(self, *a: Any, **k: Any) -> Any:
        return self._then("approval_read", self.inner.approval_for(*a, **k))

    def begin_effect(self, *a: Any, **k: Any) -> Any:
        return self._then("after_intent", self.inner.begin_effect(*a, **k))

    def journal_model_output(self, *a: Any, **k: Any) -> Any:
        return self._then("after_model_journal", self.inner.journal_model_output(*a, **k))

    def finish_effect(self, *a: Any, **k: Any) -> Any:
        self.inner.finish_effect(*a, **k)
        return self._then("after_outcome", None)

    def commit_lap(self, *a: Any, **k: Any) -> Any:
        return self._then("after_commit", self.inner.commit_lap(*a, **k))


class Lifecycle(RuleBasedStateMachine):
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        global WORLD
        WORLD = World()
        self.w = _worker()
        self.w.queue.pending.clear()
        self.w.rt.registry = Registry()
        self.w.rt.registry.register(V1)
        store = self.w.rt.store
        assert isinstance(store, FaultyStore)
        self.store = store.inner
        self.clock = CLOCK
        self.delivered: list[DueLap] = []
        self.ids: list[str] = []
        self.terminal: dict[str, str] = {}
        self.spent: dict[str, tuple[int, int, int, int]] = {}
        self.compensated: set[str] = set()
        #: Calls with an effect each run's plan makes: the most it may apply.
        self.effectful: dict[str, int] = {}
        #: Crashes and tool errors that hit a run while it was ending.
        self.ending_faults: Counter[str] = Counter()

    # --- starting runs ------------------------------------------------------------

    @initialize(target=runs, plan=PLANS, attempts=st.sampled_from([1, 2, 3]))
    def first_run(self, plan: list[Any], attempts: int) -> str:
        """``attempts``: how many times a lap may be tried (1: every crash or
        error is the lap's last, so whatever lands then meets an ending)."""
        self.w.rt.settings = self.w.rt.settings.model_copy(
            update={"max_lap_attempts": attempts})
        return self._start(plan)

    @precondition(lambda self: len(self.ids) < 4)
    @rule(target=runs, plan=PLANS)
    def start(self, plan: list[Any]) -> str:
        return self._start(plan)

    def _start(self, plan: list[Any]) -> str:
        run = self.w.start_run(V1.name, plan)
        self.ids.append(run.id)
        self.effectful[run.id] = sum(c[0] in ("pay", "book", "charge", "wire")
                                     for t in plan if t != "glitch" for c in t)
        return run.id

    # --- deliveries and faults ---------------------------------------------------

    @precondition(lambda self: self.w.queue.pending)
    @rule(i=st.integers(0, 50), fault=st.sampled_from((None,) * 4 + STORE_POINTS + TOOL_POINTS))
    def deliver(self, i: int, fault: str | None) -> None:
        """The broker hands one queued message to a worker, which may die."""
        pending = self.w.queue.pending
        lap = pending[i % len(pending)]
        pending.remove(lap)
        self._lap(lap, fault)

    @precondition(lambda self: self.w.queue.pending)
    @rule()
    def drain(self) -> None:
        """Healthy workers handle everything queued (and what that queues)."""
        for _ in range(30):
            if not self.w.queue.pending:
                return
            self._lap(self.w.queue.pending.popleft(), None)

    @precondition(lambda self: self.w.queue.pending)
    @rule(i=st.integers(0, 50))
    def duplicate(self, i: int) -> None:
        """A redelivery of a message that is still queued (visibility timeout)."""
        pending = self.w.queue.pending
        self._lap(pending[i % len(pending)], None)

    @precondition(lambda self: self.delivered)
    @rule(i=st.integers(0, 50))
    def late(self, i: int) -> None:
        """An old message arrives again, long after its lap was handled."""
        self._lap(self.delivered[i % len(self.delivered)], None)

    @precondition(lambda self: self.w.queue.pending)
    @rule(i=st.integers(0, 50))
    def lose(self, i: int) -> None:
        """Redis loses a message."""
        pending = self.w.queue.pending
        pending.remove(pending[i % len(pending)])

    @precondition(lambda self: self.w.queue.pending)
    @rule(i=st.integers(0, 50), read=st.sampled_from(sorted(MEDDLING)), pick=st.integers(0, 3),
          fault=st.sampled_from((None, None, "after_apply", "after_outcome", "after_commit")))
    def deliver_while_an_operator_acts(self, i: int, read: str, pick: int,
                                       fault: str | None) -> None:
        """A lap runs while an operator (or another process) acts on its run,
        right after the lap read what that act changes."""
        pending = self.w.queue.pending
        lap = pending[i % len(pending)]
        pending.remove(lap)
        acts = {"signal": lambda: [self.signal(lap.run_id, n) for n in ("a", "b")],
                "approve": lambda: self.decide(lap.run_id, True),
                "reject": lambda: self.decide(lap.run_id, False),
                "cancel": lambda: self.cancel(lap.run_id),
                "retry": lambda: self.retry(lap.run_id),
                "resolve": lambda: self.resolve(lap.run_id)}
        verbs = MEDDLING[read]
        verb = verbs[pick % len(verbs)]
        WORLD.meddle = (read, acts[verb])
        self._lap(lap, fault)

    def _lap(self, lap: DueLap, fault: str | None) -> None:
        self.delivered.append(lap)
        WORLD.armed = fault
        try:
            run_lap(self.w.rt, lap.run_id, lap.lap)
        except Crash:
            pass
        finally:
            fired = fault is not None and WORLD.armed is None
            WORLD.armed, WORLD.meddle = None, None
        run = self.store.get_run(lap.run_id)
        if fired and run is not None and run.ending is not None:
            self.ending_faults[lap.run_id] += 1

    # --- time and the sweeper --------------------------------------------------------

    @rule(seconds=st.sampled_from([0, 1, 31, 61, 601, 3601]))
    def sweep(self, seconds: int = 0) -> None:
        """Time passes (a clock jump past leases, overdue sends, timers or
        approval timeouts), then the sweeper runs."""
        _advance(seconds)
        self.w.sweep()
        # Runs of earlier examples stay in the database; this example ignores
        # them so that it replays the same way when hypothesis shrinks it.
        pending = self.w.queue.pending
        for lap in [lap for lap in pending if lap.run_id not in self.ids]:
            pending.remove(lap)

    @rule()
    def prune(self) -> None:
        """Retention with both ages at zero: every finished run loses its history."""
        now = self.clock.now()
        self.store.prune(checkpoints_before=now, ledger_before=now + timedelta(seconds=1),
                         batch=500)

    @precondition(lambda self: self.w.rt.registry.resolve(V1.name, "2") is None)
    @rule()
    def deploy(self) -> None:
        """Version 2 (resumes 1) replaces version 1 on the only worker."""
        registry = Registry()
        registry.register(V2)
        self.w.rt.registry = registry

    # --- operator verbs ----------------------------------------------------------------

    @rule(run_id=runs, name=st.sampled_from(["a", "b"]))
    def signal(self, run_id: str, name: str) -> None:
        self._verb(lambda: self.w.send_signal(run_id, name, {"n": 1}))

    @rule(run_id=runs, approved=st.booleans())
    def decide(self, run_id: str, approved: bool) -> None:
        alice = acting(self.w, "alice")
        for a in self.w.list_approvals(run_id=run_id):
            self._verb(lambda a=a: (alice.approve if approved else alice.reject)(a.id))

    @rule(run_id=runs)
    def cancel(self, run_id: str) -> None:
        self._verb(lambda: acting(self.w, "carol").cancel(run_id, reason="model test"))

    @rule(run_id=runs)
    def retry(self, run_id: str) -> None:
        if self._verb(lambda: acting(self.w, "ops").retry(run_id)):
            self.terminal.pop(run_id, None)

    @precondition(lambda self: len(self.ids) < 6)
    @rule(target=runs, run_id=runs, back=st.integers(0, 3))
    def fork(self, run_id: str, back: int) -> str:
        run = self.w.get_run(run_id)
        forked: list[str] = []
        self._verb(lambda: forked.append(self.w.fork(run_id, max(run.lap - back, 0)).id))
        self.ids.extend(forked)
        self.effectful.update(dict.fromkeys(forked, self.effectful[run_id]))
        return forked[0] if forked else run_id

    @rule(run_id=runs)
    def resolve(self, run_id: str) -> None:
        """A human looks at the vendor's dashboard and says what really happened."""
        for e in self.store.list_effects(run_id):
            if e.status in ("unknown", "pending"):  # resolving a pending one is refused
                landed = WORLD.find(e.key)
                self._verb(lambda e=e, landed=landed: acting(self.w, "ops").resolve_effect(
                    e.key, applied=landed is not None, result=landed))

    def _verb(self, call: Any) -> bool:
        """An operator verb; a clear refusal is a fine answer."""
        try:
            call()
        except AgentWorkerError:
            return False
        return True

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def guarantees_hold(self) -> None:
        for key, n in WORLD.applied.items():
            assert n <= 1, f"effect {key} applied {n} times"
        with self.store.engine.connect() as c:
            rows = {r.id: r for r in c.execute(select(runs).where(runs.c.id.in_(self.ids)))}
            twice = c.execute(
                select(events.c.run_id, events.c.lap).where(
                    events.c.kind == "lap_committed", events.c.run_id.in_(self.ids))
                .group_by(events.c.run_id, events.c.lap).having(func.count() > 1)).all()
            ledger = {e.key: e for e in c.execute(
                select(effects).where(effects.c.run_id.in_(self.ids)))}
        assert not twice, f"laps committed twice: {twice}"
        for key in self.compensated & ledger.keys():
            assert ledger[key].status == "compensated", f"{key} resurrected"
            assert WORLD.applied[key] == WORLD.released[key] == 1
        self.compensated |= {k for k, e in ledger.items() if e.status == "compensated"}
        for run_id in self.ids:
            self._check(rows[run_id], ledger)

    def _check(self, run: Any, ledger: dict[str, Any]) -> None:
        if run.id in self.terminal:
            assert run.status == self.terminal[run.id], (
                f"{run.id} left {self.terminal[run.id]} for {run.status}")
        elif run.status in TERMINAL:
            self.terminal[run.id] = run.status
        spent = (run.laps_used, run.input_tokens, run.output_tokens, run.cost_micros)
        before = self.spent.get(run.id, (0, 0, 0, 0))
        assert all(a >= b for a, b in zip(spent, before, strict=True)), (before, spent)
        self.spent[run.id] = spent
        if run.status == "waiting":
            self._waits_on_something(run.id, run.waiting_for, ledger)
        if run.status == "sleeping":
            assert run.wake_at is not None, f"{run.id} sleeps with no timer"
        mine = [k for k in WORLD.applied if k.startswith(f"{run.id}:")]
        assert len(mine) <= self.effectful[run.id], f"{run.id} re-did effects: {mine}"
        if run.status == "succeeded":
            undone = [k for k, e in ledger.items() if e.run_id == run.id
                      and e.status == "compensated"]
            assert not undone, f"{run.id} succeeded on compensated effects {undone}"
        if run.error_code == "compensation_failed":
            assert self.ending_faults[run.id], f"{run.id}: its ending failed with no fault"
        elif run.status in ("cancelled", "failed"):
            standing = [k for k in mine if WORLD.kinds[k] == "compensatable"
                        and WORLD.applied[k] != WORLD.released[k]]
            assert not standing, f"{run.id} ended {run.status} with {standing} in place"

    def _waits_on_something(self, run_id: str, waiting_for: str | None,
                            effects: dict[str, Any]) -> None:
        """Nothing stuck silently: a waiting run waits on a named human action
        that has not happened yet (one that did would be a lost wake-up)."""
        kind, _, name = (waiting_for or "").partition(":")
        if kind == "approval":
            matches: list[ApprovalRecord | None] = [
                a for a in self.w.list_approvals(status="pending", run_id=run_id) if a.id == name]
            [approval] = matches or [None]
            assert approval is not None, f"{run_id} waits on a decided approval {name}"
        elif kind == "signal":
            assert not self.store.pending_signals(run_id, name), (
                f"{run_id} waits for signal {name} that already arrived")
        elif kind == "effect":
            assert name in effects, f"{run_id} waits on effect {name}, which is gone"
            assert effects[name].status == "unknown", (name, effects[name].status)
        else:
            assert kind in ("budget", "attention"), waiting_for

    def teardown(self) -> None:
        """Nothing stuck: with time, sweeps and truthful humans, every run ends."""
        try:
            for _ in range(30):
                _advance(3601)
                for _ in range(50):
                    self.sweep()
                    if not self.w.queue.pending:
                        break
                    while self.w.queue.pending:
                        self._lap(self.w.queue.pending.popleft(), None)
                waiting = [r for r in map(self.store.get_run, self.ids)
                           if r is not None and not r.finished]
                if not waiting:
                    break
                for run in waiting:
                    kind, _, name = (run.waiting_for or "").partition(":")
                    if kind == "effect":
                        self.resolve(run.id)
                    elif kind == "approval":
                        self.decide(run.id, True)
                    elif kind == "signal":
                        self.signal(run.id, name)
            stuck = [(r.id, r.status, r.waiting_for) for r in map(self.store.get_run, self.ids)
                     if r is not None and not r.finished]
            assert not stuck, f"runs that never finish: {stuck}"
            self.guarantees_hold()
        finally:
            WORLD.armed = None


#: One clock for every example: it only moves forward, like time.
CLOCK = ManualClock(datetime.now(UTC))
_workers: list[InProcessWorker] = []
_SHIFT = text("UPDATE testclock.shift SET seconds = seconds + :s")


def _shifts_database_time(store: SqlStore) -> bool:
    """Whether the test database has a movable clock (a ``testclock.shift``
    that its ``now()`` adds): where leases and timers are compared on the
    database's time, a jump must move that clock too."""
    with store.engine.connect() as c:
        return c.execute(text("SELECT to_regclass('testclock.shift')")).scalar() is not None


def _advance(seconds: float) -> None:
    CLOCK.advance(seconds=seconds)
    store = _worker().rt.store
    assert isinstance(store, FaultyStore)
    if seconds and store.shifts:
        with store.inner.engine.begin() as c:
            c.execute(_SHIFT, {"s": seconds})


def _worker() -> InProcessWorker:
    return _workers[0]


@pytest.fixture
def postgres(database_url: str) -> Iterator[None]:
    """One worker for all examples (migrating the schema once), on the
    session's Postgres database, with the runs earlier tests left unfinished
    there ended first (every sweep after a clock jump would re-send them)."""
    end_unfinished_runs(database_url)
    w = InProcessWorker(database_url, clock=CLOCK, retry_backoff_seconds=1,
                        max_lap_attempts=2, lease_ttl_seconds=30, queued_overdue_seconds=60)
    default = w.rt.store
    assert isinstance(default, SqlStore)
    default.dispose()
    # Surviving a Postgres crash is the chaos suite's proof; this test is about
    # interleavings, so its commits skip the fsync wait (10x more examples).
    store = SqlStore(make_engine(database_url,
                                 connect_args={"options": "-c synchronous_commit=off"}))
    faulty = FaultyStore(store)
    w.rt.store = faulty
    _workers.append(w)
    moved = CLOCK.now()
    yield
    if faulty.shifts:  # set the database's time back for the tests after this one
        with store.engine.begin() as c:
            c.execute(_SHIFT, {"s": -(CLOCK.now() - moved).total_seconds()})
    _workers.clear()
    w.close()  # its heartbeat thread and the faulty store's connections


# Minutes of model steps, but it measures no time and moves only its own test
# database's clock: it runs in the parallel phase of deploy/local/test.sh.
# Bounded by its example count, not by time: 46 s alone on a quiet 2-core
# machine, 154 s on the slowest host seen, 304 s beside other suites and a
# benchmark on 2 cores; the timeout only catches a hang.
@pytest.mark.timeout(900)
def test_lifecycle_model(postgres: None) -> None:
    """CI: a fixed set of examples (derandomized, so CI is reproducible);
    ``AGENT_WORKER_MODEL_RANDOM=1`` explores new ones (a soak), and
    ``AGENT_WORKER_MODEL_NO_SHRINK=1`` reports a failure at once, unshrunk."""
    phases = [p for p in Phase if not (os.environ.get("AGENT_WORKER_MODEL_NO_SHRINK")
                                       and p in (Phase.shrink, Phase.explain))]
    run = settings(max_examples=EXAMPLES, stateful_step_count=15, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                   derandomize=not os.environ.get("AGENT_WORKER_MODEL_RANDOM"),
                   phases=phases)(Lifecycle)
    run.TestCase().runTest()
