"""Durable schedules on both dialects under a controlled clock: each catch-up
and overlap policy, the verbs, their validation, and two passes racing for
one fire time. Postgres compares on the database's clock (moved with
``db_clock``); SQLite on the in-process clock (a ``ManualClock``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import delete, select

from agent_worker.agent import Agent, Registry
from agent_worker.core.clock import DatabaseClock, ManualClock
from agent_worker.core.errors import (
    AgentWorkerError,
    InvalidInputError,
    InvalidScheduleError,
    ScheduleExistsError,
    UnknownAgentError,
    UnknownScheduleError,
)
from agent_worker.engine.newrun import new_run
from agent_worker.engine.schedules import fire_due, run_id_for
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.store.schedtypes import Fire, Firing
from agent_worker.store.schedules import schedules
from agent_worker.store.sql import SqlStore


class Order(BaseModel):
    orders: int


class Clock:
    """Moves whichever clock decides due times for the dialect under test."""

    def __init__(self, w: InProcessWorker, db_clock: Any) -> None:
        self.w, self.db_clock = w, db_clock

    def now(self) -> datetime:
        return self.w.rt.clock.now()

    def advance(self, seconds: float) -> None:
        if self.db_clock is None:
            clock = self.w.rt.clock
            assert isinstance(clock, ManualClock)
            clock.advance(seconds=seconds)
        else:
            self.db_clock.advance(seconds=seconds)


@pytest.fixture
def env(dialect_url: str, request: pytest.FixtureRequest
        ) -> Iterator[tuple[InProcessWorker, Clock]]:
    """A worker with one test agent, its clock five seconds into a minute."""
    if dialect_url.startswith("sqlite"):
        w = InProcessWorker(dialect_url, clock=ManualClock(datetime(2026, 1, 1, 0, 0, 5,
                                                                    tzinfo=UTC)),
                            schedule_grace_seconds=30)
        clock = Clock(w, None)
    else:
        w = InProcessWorker(dialect_url, schedule_grace_seconds=30)
        store = w.rt.store
        assert isinstance(store, SqlStore)
        w.rt.clock = DatabaseClock(store.current_time, refresh_seconds=0)
        clock = Clock(w, request.getfixturevalue("db_clock"))
        now = clock.now()
        clock.advance(65 - now.second - now.microsecond / 1e6)
    w.rt.registry = Registry()
    w.rt.registry.register(Agent(name="nightly", model=ScriptedModel(lambda r: turn("done"))))
    w.rt.registry.register(Agent(name="typed", model=ScriptedModel(lambda r: turn("done")),
                                 input_model=Order))
    yield w, clock
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:  # the Postgres database is the session's
        c.execute(delete(schedules))
    w.close()


def _name() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


def _minute(t: datetime, k: int = 0) -> datetime:
    return t.replace(second=0, microsecond=0) + timedelta(minutes=k)


def _runs(w: InProcessWorker, name: str) -> list[str]:
    return sorted(r.id for r in w.list_runs(agent="nightly", limit=1000)
                  if r.id.startswith(name + "@"))


def test_each_fire_time_starts_one_run_whatever_the_passes(env: tuple[InProcessWorker, Clock]
                                                          ) -> None:
    w, clock = env
    name, t0 = _name(), clock.now()
    s = w.schedule(name, "nightly", "* * * * *", {"n": 1}, overlap="allow")
    assert s.next_fire_at == _minute(t0, 1) and s.created_by == w.principal.id
    assert fire_due(w.rt) == 0  # not due yet
    clock.advance(60)
    assert fire_due(w.rt) == 1
    assert fire_due(w.rt) == 0  # a second pass at the same time starts nothing
    clock.advance(60)
    assert fire_due(w.rt) == 1
    assert _runs(w, name) == [run_id_for(name, _minute(t0, 1)), run_id_for(name, _minute(t0, 2))]
    assert w.get_run(run_id_for(name, _minute(t0, 1))).input == {"n": 1}
    assert w.get_schedule(name).last_run_id == run_id_for(name, _minute(t0, 2))
    assert w.run_until_idle() > 0
    assert {w.get_run(r).status for r in _runs(w, name)} == {"succeeded"}


@pytest.mark.parametrize(("catchup", "limit", "fired"), [
    ("skip", 10, [4]), ("once", 10, [3, 4]), ("all", 10, [1, 2, 3, 4]), ("all", 2, [2, 3, 4])])
def test_a_beat_down_for_three_intervals_fires_what_the_catchup_policy_promises(
        env: tuple[InProcessWorker, Clock], catchup: Any, limit: int, fired: list[int]) -> None:
    """Minutes 1-3 pass with no pass running (more than the 30 s grace ago);
    minute 4 is 5 s old when the beat is back: on time."""
    w, clock = env
    name, t0 = _name(), clock.now()
    w.schedule(name, "nightly", "* * * * *", catchup=catchup, catchup_limit=limit,
               overlap="allow")
    clock.advance(4 * 60)
    assert fire_due(w.rt) == len(fired)
    assert _runs(w, name) == [run_id_for(name, _minute(t0, k)) for k in fired]
    # Each run says why it started: minute 4 on time, the others caught up.
    for k in fired:
        [event] = [e for e in w.events(run_id_for(name, _minute(t0, k)))
                   if e.kind == "schedule_fired"]
        assert event.data == {"schedule": name, "fire_at": _minute(t0, k).isoformat(),
                              "missed": k != 4}
    assert w.get_schedule(name).next_fire_at == _minute(t0, 5)
    assert fire_due(w.rt) == 0


def test_a_late_pass_of_the_only_fire_time_is_a_miss_only_for_skip(
        env: tuple[InProcessWorker, Clock]) -> None:
    w, clock = env
    skip, once = _name(), _name()
    w.schedule(skip, "nightly", "* * * * *", catchup="skip")
    w.schedule(once, "nightly", "* * * * *", catchup="once")
    clock.advance(55 + 40)  # the fire time is 40 s old: past the grace
    fire_due(w.rt)
    assert _runs(w, skip) == [] and len(_runs(w, once)) == 1


def _fire_next(w: InProcessWorker, clock: Clock) -> int:
    clock.advance(60)
    return fire_due(w.rt)


def test_overlap_skip_starts_nothing_while_the_previous_run_goes_on(
        env: tuple[InProcessWorker, Clock]) -> None:
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="skip")
    assert _fire_next(w, clock) == 1
    first = _runs(w, name)
    assert _fire_next(w, clock) == 0  # the first run is still queued
    assert _runs(w, name) == first
    w.run_until_idle()
    assert _fire_next(w, clock) == 1  # it finished: the next one starts


def test_overlap_allow_starts_beside_the_previous_run(env: tuple[InProcessWorker, Clock]
                                                     ) -> None:
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="allow")
    assert _fire_next(w, clock) == 1
    assert _fire_next(w, clock) == 1
    assert {w.get_run(r).status for r in _runs(w, name)} == {"queued"}


def test_overlap_cancel_cancels_the_previous_run_and_starts(env: tuple[InProcessWorker, Clock]
                                                           ) -> None:
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="cancel")
    _fire_next(w, clock)
    [first] = _runs(w, name)
    assert _fire_next(w, clock) == 1
    second = next(r for r in _runs(w, name) if r != first)
    prev = w.get_run(first)
    assert prev.cancel_requested_at is not None and prev.cancelled_by == f"schedule:{name}"
    assert second in (prev.cancel_reason or "")
    w.run_until_idle()
    assert w.get_run(first).status == "cancelled"
    assert w.get_run(second).status == "succeeded"


def test_two_passes_racing_for_one_fire_time_start_one_run(
        env: tuple[InProcessWorker, Clock], monkeypatch: pytest.MonkeyPatch) -> None:
    """The worst interleaving: pass B fires and commits between pass A's read
    of the due schedule and A's claim. A's claim finds the time moved."""
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="allow")
    clock.advance(60)
    store = w.rt.store
    real = store.fire_schedule
    inner: list[int] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not inner:
            inner.append(0)
            monkeypatch.setattr(store, "fire_schedule", real)
            inner[0] = fire_due(w.rt)  # pass B, in full
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "fire_schedule", racing)
    assert fire_due(w.rt) == 0  # pass A
    assert inner == [1]
    assert len(_runs(w, name)) == 1


def test_a_lost_or_held_claim_writes_nothing(env: tuple[InProcessWorker, Clock]) -> None:
    """The claim itself, not only the run id, fences a fire time: a pass
    holding a stale ``next_fire_at`` creates nothing even for a run id that
    does not exist yet; on Postgres a pass skips a row another pass holds."""
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="allow")
    stale = w.get_schedule(name).next_fire_at
    clock.advance(60)
    assert fire_due(w.rt) == 1
    spec = w.rt.registry.get("nightly")
    other = new_run(spec, None, run_id=f"{name}@other", tenant=None, budget=None,
                    now=clock.now())
    store = w.rt.store
    assert store.fire_schedule(name, claimed=stale, next_fire_at=stale + timedelta(hours=1),
                               fires=[Fire(stale, other)], by="t", now=clock.now()) == Firing()
    assert store.get_run(other.id) is None
    assert w.get_schedule(name).next_fire_at == stale + timedelta(minutes=1)
    if not isinstance(store, SqlStore) or store.engine.dialect.name != "postgresql":
        return
    clock.advance(60)
    with store.engine.connect() as held:
        held.execute(select(schedules).where(schedules.c.name == name).with_for_update())
        assert fire_due(w.rt) == 0  # skipped, not blocked
        held.rollback()
    assert fire_due(w.rt) == 1


def test_pause_resume_trigger_and_delete(env: tuple[InProcessWorker, Clock]) -> None:
    w, clock = env
    name, t0 = _name(), clock.now()
    w.schedule(name, "nightly", "* * * * *")
    assert w.pause_schedule(name).paused
    assert _fire_next(w, clock) == 0 and _fire_next(w, clock) == 0
    run = w.trigger_schedule(name)  # a paused schedule can still be fired by hand
    assert run is not None and run.id.startswith(name + "@")
    w.run_until_idle()  # overlap "skip": the triggered run must end first
    resumed = w.resume_schedule(name)
    # Fire times that passed while paused are not owed.
    assert not resumed.paused and resumed.next_fire_at == _minute(t0, 3)
    assert _fire_next(w, clock) == 1
    assert [s.name for s in w.list_schedules() if s.name == name] == [name]
    w.delete_schedule(name)
    with pytest.raises(UnknownScheduleError):
        w.get_schedule(name)
    with pytest.raises(UnknownScheduleError):
        w.delete_schedule(name)
    assert all(r.startswith(name) for r in _runs(w, name))  # runs stay


def test_a_trigger_twice_in_one_second_starts_one_run(env: tuple[InProcessWorker, Clock]
                                                      ) -> None:
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "0 2 * * *", overlap="allow")
    # Both triggers read the same second (a fixed clock: a loaded machine may
    # take longer than the rest of a second between two calls).
    at = clock.now().replace(microsecond=100)
    w.rt.clock = ManualClock(at)
    a = w.trigger_schedule(name)
    w.rt.clock = ManualClock(at.replace(microsecond=900_000))
    b = w.trigger_schedule(name)
    assert a is not None and b is not None and a.id == b.id == run_id_for(name, at)
    assert len(_runs(w, name)) == 1


def _refused(w: InProcessWorker, call: Callable[[], Any]) -> AgentWorkerError:
    with pytest.raises(AgentWorkerError) as e:
        call()
    return e.value


def test_bad_schedules_are_refused_with_clear_errors(env: tuple[InProcessWorker, Clock]
                                                    ) -> None:
    w, _ = env
    name = _name()
    cases: list[tuple[Callable[[], Any], type[AgentWorkerError]]] = [
        (lambda: w.schedule(name, "nightly", "61 * * * *"), InvalidScheduleError),
        (lambda: w.schedule(name, "nightly", "0 0 30 2 *"), InvalidScheduleError),
        (lambda: w.schedule(name, "nobody"), UnknownAgentError),
        (lambda: w.schedule(name, "nightly", timezone="Mars/Olympus"), InvalidScheduleError),
        (lambda: w.schedule(name, "typed", input={"orders": "many"}), InvalidInputError),
        (lambda: w.schedule(name, "nightly", catchup="sometimes"), InvalidScheduleError),  # type: ignore[arg-type]
        (lambda: w.schedule(name, "nightly", overlap="queue"), InvalidScheduleError),  # type: ignore[arg-type]
        (lambda: w.schedule(name, "nightly", catchup="all", catchup_limit=10**6),
         InvalidScheduleError),
        (lambda: w.schedule("a@b", "nightly"), InvalidInputError),
        (lambda: w.schedule("n\x00", "nightly"), InvalidInputError),
        (lambda: w.schedule("x" * 101, "nightly"), InvalidInputError),
    ]
    for call, error in cases:
        assert isinstance(_refused(w, call), error)
    assert w.list_schedules() == []  # nothing was written
    w.schedule(name, "typed", input={"orders": 2}, timezone="Europe/Berlin")
    assert isinstance(_refused(w, lambda: w.schedule(name, "nightly")), ScheduleExistsError)
    assert isinstance(_refused(w, lambda: w.get_schedule("n\x00")), UnknownScheduleError)


@pytest.mark.parametrize("verb", ["pause", "delete", "resume"])
def test_a_verb_landing_between_a_pass_read_and_its_claim_wins(
        env: tuple[InProcessWorker, Clock], monkeypatch: pytest.MonkeyPatch, verb: str) -> None:
    """Pause, delete or resume commits after the pass read the schedule as
    due: the pass starts nothing (the claim checks paused and the fire time)."""
    w, clock = env
    name = _name()
    w.schedule(name, "nightly", "* * * * *", overlap="allow")
    clock.advance(60)
    store = w.rt.store
    real = store.fire_schedule

    def late(*args: Any, **kwargs: Any) -> Any:
        if verb == "resume":  # a pause and resume between: the next fire time moved on
            w.pause_schedule(name)
            w.resume_schedule(name)
        else:
            getattr(w, f"{verb}_schedule")(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "fire_schedule", late)
    assert fire_due(w.rt) == 0
    assert _runs(w, name) == []


def test_a_schedule_whose_agent_is_gone_moves_on_without_stalling_the_pass(
        env: tuple[InProcessWorker, Clock]) -> None:
    w, clock = env
    gone, kept = _name(), _name()
    w.rt.registry.register(Agent(name="retired", model=ScriptedModel(lambda r: turn("x"))))
    w.schedule(gone, "retired", "* * * * *")
    w.schedule(kept, "nightly", "* * * * *", tenant="acme")
    w.rt.registry = Registry()
    w.rt.registry.register(Agent(name="nightly", model=ScriptedModel(lambda r: turn("done"))))
    t0 = clock.now()
    clock.advance(60)
    assert fire_due(w.rt) == 1
    assert w.get_schedule(gone).next_fire_at == _minute(t0, 2)  # moved on, nothing started
    [run] = _runs(w, kept)
    assert w.get_run(run).tenant == "acme"
    assert fire_due(w.rt) == 0


def test_hostile_input_is_stored_by_the_untrusted_rule_or_refused(
        env: tuple[InProcessWorker, Clock]) -> None:
    """What a run refuses a schedule refuses; what a run stores cleaned, the
    schedule stores and fires cleaned, the same on both dialects."""
    w, clock = env
    with pytest.raises(InvalidInputError):
        w.schedule(_name(), "nightly", input={"n": float("nan")})
    with pytest.raises(InvalidInputError):
        w.schedule(_name(), "nightly", input={"x": object()})
    name = _name()
    s = w.schedule(name, "nightly", "* * * * *", input={"k\x00": "v\ud800", "rtl": "\u202e"})
    assert s.input == {"k\ufffd": "v\ufffd", "rtl": "\u202e"}
    assert w.get_schedule(name).input == s.input
    clock.advance(60)
    fire_due(w.rt)
    [run] = _runs(w, name)
    assert w.get_run(run).input == s.input
