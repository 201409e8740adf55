"""Fair share on the in-process engine, SQLite and Postgres: caps
hold a run in Postgres (no message, the claim refuses it) and a freed slot
admits the next; priorities order a tenant's line; weights split a shared cap;
a dead worker's slot comes back at the sweep; a removed cap lets runs out.

Each test has its own agents (a private registry: a capped agent in the
process-wide registry would switch admission on for every other test) and its
own tenants (the Postgres database is shared by the session)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text, update

from agent_worker import Agent, InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Registry
from agent_worker.core.budget import Budget, BudgetLedger
from agent_worker.core.checkpoint import Checkpoint, dump_checkpoint
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.core.errors import ConfigurationError, InvalidInputError, NotFoundError
from agent_worker.core.messages import Message, ModelRequest, ModelResponse
from agent_worker.core.settings import Settings
from agent_worker.engine.lap import run_lap
from agent_worker.fairshare import gate, policy
from agent_worker.model.failures import RateLimitedError
from agent_worker.store import admitting
from agent_worker.store.admitting import THROTTLED, AgentShare, Policy
from agent_worker.store.base import DueLap, NewRun
from agent_worker.store.rows import message_body, runs
from agent_worker.store.sql import SqlStore
from tests.engine.conftest import swept
from tests.store_helpers import end_fair_share


@tool
def tick(n: int) -> int:
    """Count."""
    return n


def _laps(n: int) -> Any:
    def script(r: ModelRequest) -> ModelResponse:
        return turn("done") if r.lap >= n else turn("", [("tick", {"n": r.lap})])
    return script


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def fleet(dialect_url: str) -> Iterator[InProcessWorker]:
    """A worker with a private registry. Its test ends with no limit and no
    run waiting for a slot in the database (``end_fair_share``): on Postgres
    that is the session's, and either would slow every later test."""
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0)
    w.rt.registry = Registry()
    yield w
    w.close()
    end_fair_share(dialect_url)


def _agent(w: InProcessWorker, laps: int = 1, **kw: Any) -> str:
    name = f"fs-{_uid()}"
    w.rt.registry.register(Agent(name=name, model=ScriptedModel(_laps(laps)), tools=[tick],
                                 **kw))
    return name


def _holders(w: InProcessWorker, agent: str) -> int:
    return sum(line.in_flight for line in w.queues() if line.agent == agent)


def _step(w: InProcessWorker) -> str:
    """Run the next queued lap; return its run id."""
    lap = w.queue.pending.popleft()
    run_lap(w.rt, lap.run_id, lap.lap)
    return lap.run_id


def test_capped_runs_wait_in_postgres_and_the_freed_slot_admits_the_next(
        fleet: InProcessWorker) -> None:
    agent = _agent(fleet, laps=2, concurrency=2)
    ids = [fleet.start_run(agent, "go", tenant=f"t{_uid()}").id for _ in range(6)]
    # Two messages for six runs: the other four wait in Postgres with no message.
    assert len(fleet.queue.pending) == 2
    waiting = [fleet.get_run(i) for i in ids[2:]]
    assert all(r.status == "queued" and r.admitted_lap == THROTTLED for r in waiting)
    # A stale or forged message for a waiting run is refused at the claim.
    assert fleet.rt.store.claim(ids[5], 1, owner="x", now=fleet.rt.clock.now(),
                                lease_seconds=10, window_messages=10) is None
    # The sweeper does not re-send waiting runs (they have no message to lose).
    assert swept(fleet, ids) == [] and len(fleet.queue.pending) == 2
    seen = 0
    while fleet.queue.pending:
        _step(fleet)
        seen += 1
        assert _holders(fleet, agent) <= 2
        assert len(fleet.queue.pending) <= 2
    assert seen == 12
    assert all(fleet.get_run(i).status == "succeeded" for i in ids)


def test_a_high_priority_run_goes_ahead_of_its_tenants_queued_batch(
        fleet: InProcessWorker) -> None:
    agent, tenant = _agent(fleet), f"t{_uid()}"
    fleet.set_share(tenant, concurrency=1)
    # 500 runs submitted at once (one admission pass), then the urgent one.
    batch = _bulk_runs(fleet, agent, tenant, 500)
    fleet.rt.send_all([DueLap(run_id, 1, agent, "1") for run_id in batch])
    urgent = fleet.start_run(agent, "u", tenant=tenant, priority=10).id
    order = [_step(fleet) for _ in range(3)]
    assert order == [batch[0], urgent, batch[1]]


def test_weights_split_a_shared_cap(fleet: InProcessWorker) -> None:
    agent, a, b = _agent(fleet, concurrency=4), f"a{_uid()}", f"b{_uid()}"
    fleet.set_share(b, weight=3)
    runs = {fleet.start_run(agent, "x", tenant=a).id: a for _ in range(20)}
    runs.update({fleet.start_run(agent, "x", tenant=b).id: b for _ in range(20)})
    admitted = [runs[fleet.queue.pending[-1].run_id] for _ in range(16) if _step(fleet)]
    # After A's head start (it took all 4 slots alone), B holds 3 slots to A's 1:
    # of the 16 slots freed, B got 12 (equal weights would give it 8).
    assert admitted.count(b) >= 11
    lines = {line.tenant: line.in_flight for line in fleet.queues() if line.agent == agent}
    assert lines == {a: 1, b: 3}


def test_a_dead_workers_slot_comes_back_at_the_sweep(fleet: InProcessWorker) -> None:
    agent = _agent(fleet, concurrency=1)
    first, second = (fleet.start_run(agent, "x", tenant=f"t{_uid()}").id for _ in range(2))
    lap = fleet.queue.pending.popleft()
    # A worker claims the lap and dies (never commits, never releases).
    assert fleet.rt.store.claim(lap.run_id, lap.lap, owner="dead", now=fleet.rt.clock.now(),
                                lease_seconds=0.3, window_messages=10) is not None
    assert _holders(fleet, agent) == 1
    assert fleet.get_run(second).admitted_lap == THROTTLED
    time.sleep(0.5)
    # Recovery leaves the dead lap's slot with its run (its re-send needs
    # no admission): one lap sent (the recovered run), never two.
    assert len(swept(fleet, [first, second])) == 1
    assert _holders(fleet, agent) == 1
    fleet.run_until_idle()
    assert {fleet.get_run(i).status for i in (first, second)} == {"succeeded"}


def test_removing_the_cap_lets_waiting_runs_out_at_the_sweep(fleet: InProcessWorker) -> None:
    agent, tenant = _agent(fleet), f"t{_uid()}"
    fleet.set_share(tenant, concurrency=0)
    ids = [fleet.start_run(agent, "x", tenant=tenant).id for _ in range(3)]
    assert not fleet.queue.pending and swept(fleet, ids) == []
    line = next(q for q in fleet.queues() if q.tenant == tenant)
    assert (line.tenant_cap, line.queued, line.throttled, line.in_flight) == (0, 3, 3, 0)
    assert line.oldest_wait_seconds is not None and line.oldest_wait_seconds >= 0
    fleet.clear_share(tenant)
    assert sorted(swept(fleet, ids)) == sorted(ids)
    fleet.run_until_idle()
    assert all(fleet.get_run(i).status == "succeeded" for i in ids)


def test_bad_fair_share_input_is_refused(fleet: InProcessWorker) -> None:
    agent = _agent(fleet)
    bads: tuple[Any, ...] = (-1001, True, 1.5, 10_000, "1")
    for bad in bads:
        with pytest.raises(InvalidInputError, match="priority"):
            fleet.start_run(agent, "x", priority=bad)
    for kwargs in ({}, {"concurrency": -1}, {"concurrency": True}, {"weight": 0},
                   {"weight": float("nan")}, {"agent": agent, "weight": 2.0}):
        with pytest.raises(InvalidInputError):
            fleet.set_share("acme", **kwargs)
    with pytest.raises(InvalidInputError):
        fleet.set_share("bad tenant\n", concurrency=1)
    with pytest.raises(NotFoundError):
        fleet.clear_share(f"t{_uid()}")
    with pytest.raises(ConfigurationError):
        Settings(provider_concurrency="openai=zero")
    with pytest.raises(InvalidInputError):
        Agent(name="x", model=ScriptedModel(_laps(1)), concurrency=0)


def test_concurrent_admissions_never_exceed_a_cap(database_url: str) -> None:
    """Eight admitters at once on Postgres, each asking for its own runs:
    the advisory lock makes the count and the admission one step."""
    w = InProcessWorker(database_url)
    w.rt.registry = Registry()
    agent = _agent(w)
    store = SqlStore(database_url)
    ids = [w.rt.store.create_run(_new_run(w, agent, f"race-{_uid()}"))[0].id
           for _ in range(40)]
    policy = Policy(agents={agent: AgentShare(concurrency=3)})
    assert admit_racing(store, ids, policy, w.rt.clock.now()) == 3
    assert _holders(w, agent) == 3
    store.dispose()
    w.close()
    end_fair_share(database_url)


def test_a_sweep_takes_no_admission_lock_for_runs_it_cannot_admit(database_url: str) -> None:
    """A run of an agent this process does not know waits for a slot (its cap
    was removed, or another fleet serves it): a sweep here, with no cap in
    force, reads that nobody it could admit waits and does not queue behind
    the fleet-wide admission lock (it did, reading every waiting line, on
    every sweep of every process while any run anywhere waited)."""
    w = InProcessWorker(database_url)
    w.rt.registry = Registry()
    mine, theirs = _agent(w), f"fs-{_uid()}"
    store = SqlStore(database_url)
    [waiting] = _bulk_runs(w, theirs, f"t{_uid()}", 1)
    with store.engine.begin() as c:
        c.execute(update(runs).where(runs.c.id == waiting).values(admitted_lap=THROTTLED))
    answer: list[Any] = []
    try:
        with store.engine.begin() as holder:
            holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": admitting.LOCK_KEY})
            sweep = threading.Thread(target=lambda: answer.append(store.admit(
                [], Policy(agents={mine: AgentShare()}), now=w.rt.clock.now())), daemon=True)
            sweep.start()
            sweep.join(timeout=20)
            assert answer == [[]], "the sweep waited for the admission lock"
    finally:
        store.dispose()
        w.close()
        end_fair_share(database_url)


def admit_racing(store: SqlStore, ids: list[str], policy: Policy, now: datetime) -> int:
    """Eight threads admitting their share of ``ids`` at once; how many laps
    they were given to send, together."""
    sent: list[int] = []
    barrier = threading.Barrier(8)

    def admitter(mine: list[str]) -> None:
        barrier.wait()
        sent.append(len(store.admit(mine, policy, now=now)))

    threads = [threading.Thread(target=admitter, args=(ids[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent)


def _new_run(w: InProcessWorker, agent: str, run_id: str, tenant: str | None = None) -> NewRun:
    """A run as ``start_run`` writes it, without sending it."""
    ckpt = Checkpoint(lap=0, agent_name=agent, agent_version="1", message_count=1,
                      budget=BudgetLedger.start(Budget(), w.rt.clock.now()))
    return NewRun(id=run_id, tenant=tenant, agent_name=agent, agent_version="1", input="x",
                  limits=Budget().model_dump(mode="json"), retention="full",
                  checkpoint=dump_checkpoint(ckpt), schema_version=CHECKPOINT_SCHEMA_VERSION,
                  messages=[Message(role="user", content="x")], now=w.rt.clock.now())


def _bulk_runs(w: InProcessWorker, agent: str, tenant: str, n: int) -> list[str]:
    """``n`` runs as ``start_run`` writes them (run row, checkpoint 0, first
    message), in one transaction instead of ``n``: a lean test on a busy box."""
    from sqlalchemy import insert

    from agent_worker.store.rows import checkpoints, messages, runs

    new = _new_run(w, agent, "", tenant)
    ids = [f"bulk-{i:04d}-{_uid()}" for i in range(n)]
    at = [new.now + timedelta(microseconds=i) for i in range(n)]  # created in this order
    store: Any = w.rt.store
    with store.engine.begin() as c:
        c.execute(insert(runs), [dict(
            id=i, tenant=tenant, agent_name=agent, agent_version="1", status="queued",
            next_lap=1, lap_attempts=0, input="x", limits=new.limits, laps_used=0,
            input_tokens=0, output_tokens=0, cost_micros=0, retention="full", recoveries=0,
            created_at=t, updated_at=t, last_checkpoint_at=t, enqueued_at=t, priority=0)
            for i, t in zip(ids, at, strict=True)])
        c.execute(insert(checkpoints), [dict(run_id=i, lap=0, schema_version=new.schema_version,
                                             state=new.checkpoint, created_at=new.now)
                                        for i in ids])
        c.execute(insert(messages), [dict(run_id=i, seq=0, lap=0, body=message_body(
            new.messages[0]), created_at=new.now) for i in ids])
    return ids


def test_a_429_with_retry_after_holds_back_every_agent_on_that_provider_key(
        fleet: InProcessWorker) -> None:
    """One lap's 429 pauses its provider key fleet-wide: a run of another
    agent on the same key waits in Postgres until Retry-After has passed,
    while an agent on another key goes on."""
    key, other = f"p{_uid()}", f"p{_uid()}"

    def limited(r: ModelRequest) -> ModelResponse:
        raise RateLimitedError("429 from the provider", retry_after=2.0)

    hit = _agent(fleet, provider_key=key)
    fleet.rt.registry.register(Agent(name=f"fs-{_uid()}", model=ScriptedModel(limited),
                                     provider_key=key))
    failing = fleet.rt.registry.all()[-1].name
    elsewhere = _agent(fleet, provider_key=other)
    fleet.start_run(failing, "x")
    _step(fleet)  # the 429: the key is paused for 2 s (wide enough for a loaded CI)
    held = fleet.start_run(hit, "x").id
    free = fleet.start_run(elsewhere, "x").id
    assert fleet.get_run(held).admitted_lap == THROTTLED
    assert [lap.run_id for lap in fleet.queue.pending] == [free]
    time.sleep(2.2)
    fleet.sweep()
    assert held in {lap.run_id for lap in fleet.queue.pending}


def test_the_policy_is_built_once_and_again_when_what_it_reads_changes(
        fleet: InProcessWorker) -> None:
    """Every lap asks for the policy twice (its send, its rate correction):
    it is built once, and again when an agent is registered, the settings
    are replaced or the limits table is re-read (``fairshare.policy``)."""
    rt = fleet.rt
    first = policy(rt)
    assert policy(rt) is first
    name = _agent(fleet, concurrency=3)
    with_agent = policy(rt)
    assert with_agent is not first and with_agent.agents[name].concurrency == 3
    rt.settings = rt.settings.model_copy(update={"max_laps_in_flight": 7})
    assert policy(rt).fleet == 7
    tenant = f"t{_uid()}"
    fleet.set_share(tenant, concurrency=2)  # re-read at once by this process
    assert policy(rt).tenants[tenant] == 2
    fleet.clear_share(tenant)
    assert tenant not in policy(rt).tenants


def test_whether_the_store_admits_is_asked_of_each_store_object(
        fleet: InProcessWorker) -> None:
    """Decided once per store object, not per class: a wrapper passing calls
    on (``__getattr__``, as the fault tests' stores do) admits too; a store
    without admission sends every lap straight on."""
    rt, inner = fleet.rt, fleet.rt.store
    name = _agent(fleet, concurrency=1)
    laps = [DueLap(f"r-{_uid()}", 1, name, "1") for _ in range(2)]

    class Plain:
        pass

    asked: list[list[str]] = []

    class Passing:
        def __getattr__(self, attr: str) -> Any:
            return getattr(inner, attr)

        def admit(self, requested: list[str], *args: Any, **kwargs: Any) -> Any:
            asked.append(requested)
            return inner.admit(requested, *args, **kwargs)  # type: ignore[attr-defined]

    try:
        rt.store = Plain()  # type: ignore[assignment]
        assert gate(rt, laps) == laps
        rt.store = Passing()
        assert gate(rt, laps) == []  # these runs are not in the database
        assert asked == [[lap.run_id for lap in laps]]
    finally:
        rt.store = inner
