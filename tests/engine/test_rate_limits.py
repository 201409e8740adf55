"""Rate limits on the in-process engine, SQLite and
Postgres: a tenant over its laps or tokens per minute waits queued (throttled,
no message) and the sweep admits it once the sliding window allows; a lap's
token estimate is corrected from its usage at commit; concurrent admitters
cannot both take the last lap of a window; only an operator edits limits,
and a refusal is audited.

Each test has its own agents and tenants (the Postgres database is shared by
the session). Time moves on the clock that decides the window: the worker's
``ManualClock`` on SQLite, the database's (``db_clock``) on Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from agent_worker import Agent, InProcessWorker, ScriptedModel, tool, turn
from agent_worker.agent import Registry
from agent_worker.core.clock import ManualClock
from agent_worker.core.errors import ConfigurationError, InvalidInputError, PermissionDeniedError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.core.principal import Principal
from agent_worker.core.settings import Settings
from agent_worker.store.admitting import THROTTLED, AgentShare, Policy
from agent_worker.store.ratelimit import Rate, rate_charges
from agent_worker.store.rows import runs
from agent_worker.store.sql import SqlStore
from tests.engine.conftest import swept
from tests.engine.test_fair_share import _new_run, admit_racing
from tests.engine.test_schedules import Clock
from tests.store_helpers import end_fair_share


@tool
def tick(n: int) -> int:
    """Count."""
    return n


def _uid() -> str:
    return uuid.uuid4().hex[:8]


class Env(Clock):
    """A worker with a private registry, and the clock its dialect's window
    reads (``advance``)."""

    def agent(self, laps: int = 1, usage: tuple[int, int] = (100, 20)) -> str:
        def script(r: ModelRequest) -> ModelResponse:
            return (turn("done", usage=usage) if r.lap >= laps
                    else turn("", [("tick", {"n": r.lap})], usage=usage))

        name = f"rl-{_uid()}"
        self.w.rt.registry.register(Agent(name=name, model=ScriptedModel(script), tools=[tick]))
        return name


@pytest.fixture
def env(dialect_url: str, request: pytest.FixtureRequest) -> Iterator[Env]:
    if dialect_url.startswith("sqlite"):
        w = InProcessWorker(dialect_url, clock=ManualClock(datetime.now(UTC)),
                            rate_tokens_estimate=400)
        e = Env(w, None)
    else:
        w = InProcessWorker(dialect_url, rate_tokens_estimate=400)
        e = Env(w, request.getfixturevalue("db_clock"))
    w.rt.registry = Registry()
    yield e
    w.close()
    end_fair_share(dialect_url)  # no limit or waiting run of it slows the tests after


def _pending(w: InProcessWorker) -> list[str]:
    return [lap.run_id for lap in w.queue.pending]


def test_a_tenant_over_its_laps_per_minute_waits_and_resumes_when_the_window_allows(
        env: Env) -> None:
    w, agent, tenant, other = env.w, env.agent(), f"t{_uid()}", f"o{_uid()}"
    w.set_share(tenant, laps_per_minute=2)
    ids = [w.start_run(agent, "x", tenant=tenant).id for _ in range(3)]
    free = w.start_run(agent, "x", tenant=other).id
    # Two laps of the tenant's minute go; the third waits in Postgres, no message.
    assert _pending(w) == [ids[0], ids[1], free]
    assert w.get_run(ids[2]).admitted_lap == THROTTLED
    w.run_until_idle()
    assert w.get_run(ids[2]).status == "queued" and swept(w, ids) == []
    env.advance(30)
    assert swept(w, ids) == []  # still inside the minute of the first two laps
    env.advance(31)
    assert swept(w, ids) == [ids[2]] and _pending(w) == [ids[2]]
    w.run_until_idle()
    assert all(w.get_run(i).status == "succeeded" for i in [*ids, free])


def test_tokens_are_estimated_at_admission_and_corrected_from_the_usage(env: Env) -> None:
    """1,000 tokens a minute, a first lap estimated at 400, each lap really
    using 120: two runs go at once (800), a third waits; when the first two
    commit, their charges become 120 each, and the third (and a fourth) fit."""
    w, agent, tenant = env.w, env.agent(), f"t{_uid()}"
    w.set_share(tenant, tokens_per_minute=1000)
    ids = [w.start_run(agent, "x", tenant=tenant).id for _ in range(4)]
    assert _pending(w) == ids[:2]
    assert {w.get_run(i).admitted_lap for i in ids[2:]} == {THROTTLED}
    w.run_until_idle()  # each commit corrects its charge and hands the freed tokens on
    assert all(w.get_run(i).status == "succeeded" for i in ids)
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.connect() as c:
        charged = c.execute(select(rate_charges.c.tokens).where(
            rate_charges.c.tenant == tenant)).scalars().all()
    assert sorted(charged) == [120] * 4


def test_concurrent_admissions_never_take_more_than_the_window(database_url: str) -> None:
    """Eight admitters at once on Postgres against 3 laps a minute: the
    advisory lock makes reading the window and charging it one step."""
    w = InProcessWorker(database_url)
    w.rt.registry = Registry()
    name, tenant = f"rl-{_uid()}", f"race{_uid()}"
    w.rt.registry.register(Agent(name=name, model=ScriptedModel(lambda r: turn("x"))))
    ids = [w.rt.store.create_run(_new_run(w, name, f"rr-{_uid()}", tenant))[0].id
           for _ in range(40)]
    policy = Policy(agents={name: AgentShare()}, tenant_rates={tenant: Rate(laps=3)})
    store = SqlStore(database_url)
    assert admit_racing(store, ids, policy, w.rt.clock.now()) == 3
    with store.engine.connect() as c:
        assert len(c.execute(select(rate_charges.c.run_id).where(
            rate_charges.c.tenant == tenant)).all()) == 3
    store.dispose()
    w.close()
    end_fair_share(database_url)


def test_only_an_operator_edits_limits_and_a_refusal_is_audited(env: Env) -> None:
    w, tenant = env.w, f"t{_uid()}"
    submitter = w.acting_as(Principal("sam", tenant, frozenset({"submitter"})))
    with pytest.raises(PermissionDeniedError, match="share"):
        submitter.set_share(tenant, laps_per_minute=5)
    operator = w.acting_as(Principal("olga", tenant, frozenset({"operator"})))
    with pytest.raises(PermissionDeniedError, match="other tenants"):
        operator.set_share(f"x{_uid()}", laps_per_minute=5)
    with pytest.raises(PermissionDeniedError):
        operator.set_share("*", laps_per_minute=5)
    row = operator.set_share(tenant, laps_per_minute=5, tokens_per_minute=9000)
    assert (row.laps_per_minute, row.tokens_per_minute, row.updated_by) == (5, 9000, "olga")
    entries = [(e.principal, e.outcome) for e in w.audit(action="share")
               if e.target == f"share:{tenant}/*" or e.principal == "sam"]
    assert ("sam", "refused") in entries and ("olga", "ok") in entries
    assert w.audit(principal="olga", action="share")[0].changes == {
        "concurrency": None, "weight": None, "laps_per_minute": 5, "tokens_per_minute": 9000}


def test_bad_rate_limits_are_refused(env: Env) -> None:
    w, agent = env.w, env.agent()
    for kwargs in ({"laps_per_minute": -1}, {"tokens_per_minute": True},
                   {"tokens_per_minute": 1.5}, {"agent": agent, "laps_per_minute": 3}):
        with pytest.raises(InvalidInputError):
            w.set_share("acme", **kwargs)
    with pytest.raises(ConfigurationError, match="PROVIDER_TOKENS_PER_MINUTE"):
        Settings(provider_tokens_per_minute="openai=lots")


def test_the_default_rate_is_each_tenants_own_and_a_provider_rate_is_shared(
        env: Env) -> None:
    """The ``*`` row gives every tenant a window of its own; a provider key's
    tokens per minute is one window for every tenant on that key."""
    w = env.w
    agent, a, b = env.agent(), f"a{_uid()}", f"b{_uid()}"
    w.set_share("*", laps_per_minute=1)
    try:
        runs = {t: [w.start_run(agent, "x", tenant=t).id for _ in range(2)] for t in (a, b)}
        assert _pending(w) == [runs[a][0], runs[b][0]]
    finally:
        w.clear_share("*")
    key = f"p{_uid()}"
    policy = Policy(agents={agent: AgentShare(provider=key)},
                    provider_rates={key: Rate(tokens=1500)}, tokens_estimate=1000)
    store = w.rt.store
    assert isinstance(store, SqlStore)
    ids = [store.create_run(_new_run(w, agent, f"pk-{_uid()}", t))[0].id for t in (a, b)]
    assert len(store.admit(ids, policy, now=w.rt.clock.now())) == 1


def test_a_lap_over_the_rate_is_not_overtaken_by_a_smaller_one_behind_it(env: Env) -> None:
    """The head of a tenant's line waits for room in the window; the smaller
    laps behind it wait with it, or a large lap could wait for ever."""
    w, agent, tenant = env.w, env.agent(), f"t{_uid()}"
    store = w.rt.store
    assert isinstance(store, SqlStore)
    policy = Policy(agents={agent: AgentShare()}, tenant_rates={tenant: Rate(tokens=1500)},
                    tokens_estimate=1000)
    first, big, small = (store.create_run(_new_run(w, agent, f"hol-{_uid()}", tenant))[0].id
                         for _ in range(3))
    # big's mean so far is 1,200 tokens a lap, small's 100; big is older
    with store.engine.begin() as c:
        for i, (run_id, tokens) in enumerate(((big, 1200), (small, 100)), start=1):
            c.execute(update(runs).where(runs.c.id == run_id).values(
                laps_used=1, input_tokens=tokens,
                created_at=w.rt.clock.now() + timedelta(seconds=i)))
    assert [d.run_id for d in store.admit([first], policy, now=w.rt.clock.now())] == [first]
    assert store.admit([big, small], policy, now=w.rt.clock.now()) == []
