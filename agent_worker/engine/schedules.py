"""The firing pass of durable schedules, run by celery beat like the sweeper
(``tasks.schedules``) and callable directly under a test's clock.

Each firing starts exactly one run whose id is derived from the schedule and
the fire time (``nightly@2026-12-01T02:00:00Z``). A pass reads the due
schedules, plans each one's fire times from the database's clock, and hands
the plan to ``Store.fire_schedule``, which claims the schedule's
``next_fire_at`` row (``FOR UPDATE SKIP LOCKED`` plus a fenced update) in the
same transaction that creates the runs and advances it. Two beats firing at
once: one wins the row, the other finds the time moved and starts nothing;
had both got that far, the run id would still collide harmlessly.

Catch-up after beat downtime. The latest due fire time is *on time* while it
is at most ``schedule_grace_seconds`` old; every other due fire time was
missed. ``skip`` fires only an on-time one; ``once`` fires the latest missed
one too (one run for the whole gap); ``all`` fires every missed one, the
most recent ``catchup_limit`` of them. The pass must tick faster than the
shortest interval of any schedule, else ``skip`` counts a slow tick as a miss.

Overlap is decided in the firing transaction against the schedule's previous
run (``Store.fire_schedule``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from agent_worker.core.errors import AgentWorkerError
from agent_worker.engine.crontimes import latest, next_after
from agent_worker.engine.newrun import new_run
from agent_worker.runtime import Runtime
from agent_worker.store.schedtypes import Fire, Firing, ScheduleRecord

log = logging.getLogger(__name__)

#: Schedules one pass fires at most; the rest are due next tick.
PASS_LIMIT = 100


def run_id_for(name: str, fire_at: datetime) -> str:
    """The run id of ``name``'s firing at ``fire_at``: the same for every beat."""
    return f"{name}@{fire_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def actor(name: str) -> str:
    """Who a firing acts as (e.g. when it cancels the previous run)."""
    return f"schedule:{name}"


def plan(s: ScheduleRecord, now: datetime, grace_seconds: float
         ) -> tuple[list[datetime], int, datetime]:
    """The fire times a pass at ``now`` starts for ``s`` (oldest first) under
    its catch-up policy, how many of them (the first ones) were missed, and
    the schedule's next fire time after them."""
    depth = s.catchup_limit + 1 if s.catchup == "all" else 2
    due = latest(s.cron, s.timezone, since=s.next_fire_at, until=now, limit=depth)
    on_time = bool(due) and now - due[-1] <= timedelta(seconds=grace_seconds)
    current, missed = (due[-1:], due[:-1]) if on_time else ([], due)
    if s.catchup == "once":
        missed = missed[-1:]
    elif s.catchup == "all":
        missed = missed[-s.catchup_limit:]
    else:
        missed = []
    return missed + current, len(missed), next_after(s.cron, s.timezone, now)


def fire(rt: Runtime, s: ScheduleRecord, times: list[datetime], *,
         claimed: datetime | None, next_fire_at: datetime | None, now: datetime,
         missed: int = 0) -> Firing:
    """Start ``s``'s runs for ``times`` in one firing transaction, then send
    their first laps (a send lost after the commit is the sweeper's to redo)."""
    spec = rt.registry.get(s.agent_name, s.agent_version)
    fires = [Fire(t, new_run(spec, s.input, run_id=run_id_for(s.name, t), tenant=s.tenant,
                             budget=None, now=now), missed=i < missed)
             for i, t in enumerate(times)]
    firing = rt.store.fire_schedule(s.name, claimed=claimed, next_fire_at=next_fire_at,
                                    fires=fires, by=actor(s.name), now=now)
    rt.send_all(firing.due)
    return firing


def fire_due(rt: Runtime) -> int:
    """One firing pass over every due schedule; returns how many runs it started.

    A schedule whose agent no longer resolves (retired, unregistered here) is
    moved to its next fire time with nothing started, logged, so it cannot
    stall the pass; its runs resume once the agent is back."""
    now = rt.clock.now()
    grace = rt.settings.schedule_grace_seconds
    started = 0
    for s in rt.store.due_schedules(now=now, limit=PASS_LIMIT):
        times, missed, after = plan(s, now, grace)
        try:
            firing = fire(rt, s, times, claimed=s.next_fire_at, next_fire_at=after, now=now,
                          missed=missed)
        except AgentWorkerError as e:
            log.error("schedule %s cannot fire: %s", s.name, e)
            rt.store.fire_schedule(s.name, claimed=s.next_fire_at, next_fire_at=after,
                                   fires=[], by=actor(s.name), now=now)
            continue
        if firing.skipped:
            log.info("schedule %s: previous run still going, skipped %s", s.name,
                     ", ".join(firing.skipped))
        started += len(firing.started)
    return started


__all__ = ["PASS_LIMIT", "actor", "fire", "fire_due", "plan", "run_id_for"]
