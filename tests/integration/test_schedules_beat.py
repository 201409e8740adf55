"""Durable schedules through real processes: a Celery worker, two beats
firing the same every-second schedules, then every beat stopped for more than
three intervals and one restarted.

Three schedules share the cron ``* * * * * *`` and differ in catch-up policy.
What each must show: exactly one run per fire time while two beats race; after
the downtime, ``all`` fills every missed second, ``once`` starts exactly one
run for the gap, ``skip`` starts none. Each run's ``schedule_fired`` event
says whether its fire time was missed (older than the grace) when fired.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_worker.api import AgentWorker
from agent_worker.core.constants import MAINT_QUEUE
from tests.store_helpers import delete_run
from tests.support import Fleet, Proc, logs, wait_for

pytestmark = pytest.mark.integration

GRACE = 4.0
TIMING = {"AGENT_WORKER_SCHEDULE_INTERVAL_SECONDS": "0.25",
          "AGENT_WORKER_SCHEDULE_GRACE_SECONDS": str(GRACE)}
SECOND = timedelta(seconds=1)


def _beat(fleet: Fleet, tmp_path: Path, n: int) -> Proc:
    """A beat with a log of its own (``Fleet.beat`` shares one)."""
    p = Proc([sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "beat",
              "--loglevel", "INFO",
              "-s", str(tmp_path / f"beat{n}.db")], {**fleet.env, **TIMING},
             tmp_path / f"beat{n}.log").start()
    fleet.procs.append(p)
    return p


def _fired(aw: AgentWorker, name: str) -> list[tuple[datetime, bool]]:
    """(fire time, missed) of each run ``name`` started, by fire time."""
    out = []
    for run in aw.list_runs(agent="loop", limit=1000):
        if run.id.startswith(name + "@"):
            [e] = [e for e in aw.events(run.id) if e.kind == "schedule_fired"]
            assert e.data is not None
            at = datetime.fromisoformat(e.data["fire_at"])
            assert run.id == f"{name}@{at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            out.append((at, bool(e.data["missed"])))
    return sorted(out)


def _steady(fired: list[tuple[datetime, bool]]) -> datetime | None:
    """The first of three consecutive seconds fired on time, if any: from
    there the fleet is warm (a pass of a worker still starting up on a loaded
    machine can come later than the grace, a miss the policies would act on)."""
    for (a, ma), (_b, mb), (c, mc) in zip(fired, fired[1:], fired[2:], strict=False):
        if not (ma or mb or mc) and c - a == 2 * SECOND:
            return a
    return None


def _gaps(times: list[datetime]) -> list[int]:
    """Missing fire times between consecutive ones."""
    return [int((b - a) / SECOND) - 1 for a, b in itertools.pairwise(times)]


@pytest.fixture
def cleanup(aw: Any) -> Iterator[None]:
    """The session's database outlives this test: its schedules and their
    (never run) runs go, so no later fleet's sweeper runs them."""
    yield
    for s in aw.list_schedules():
        if s.name.startswith("every-"):
            aw.delete_schedule(s.name)
    for run in aw.list_runs(agent="loop", limit=1000):
        if run.id.startswith("every-"):
            delete_run(aw.rt.store, run.id)


def test_two_beats_then_a_downtime_fire_what_each_catchup_policy_promises(
        aw: Any, fleet: Fleet, tmp_path: Path, cleanup: None) -> None:
    store = aw.rt.store
    # Only the maintenance queue: the firings are under test, not the runs
    # (left queued, overlap "allow"), and laps would load the machine.
    worker = fleet.worker(concurrency=2, queues=MAINT_QUEUE, **TIMING)
    beats = [_beat(fleet, tmp_path, 1), _beat(fleet, tmp_path, 2)]
    # Schedules made once the fleet runs passes: its start-up is no downtime.
    wait_for(lambda: "fire_schedules" in worker.log.read_text()
             and "succeeded" in worker.log.read_text(), timeout=90, what="a firing pass")
    # Both beats send the pass (each on its own start-up time).
    beat_logs = [tmp_path / f"beat{n}.log" for n in (1, 2)]
    wait_for(lambda: all("agent_worker.fire_schedules" in log.read_text() for log in beat_logs),
             timeout=30, what="both beats sending the firing pass")
    for policy in ("all", "once", "skip"):
        aw.schedule(f"every-{policy}", "loop", "* * * * * *", {"laps": 0}, catchup=policy,
                    catchup_limit=100, overlap="allow")
    try:
        steady = wait_for(lambda: _steady(_fired(aw, "every-all")), timeout=120,
                          what="three on-time firings in a row with two beats")
    except AssertionError:
        print(logs(fleet))
        raise
    for b in beats:
        b.kill()
    # Both beats sent the firing pass: two schedulers raced for each second.
    for n in (1, 2):
        assert (tmp_path / f"beat{n}.log").read_text().count("agent_worker.fire_schedules") >= 2
    stopped = store.current_time()
    time.sleep(3 + GRACE + 0.5)  # three intervals older than the grace, and the drain
    restarted = store.current_time()
    _beat(fleet, tmp_path, 3)
    wait_for(lambda: all((s.last_fire_at or stopped) > restarted + 2 * SECOND
                         for s in aw.list_schedules()), timeout=90,
             what="on-time firings after the restart")

    every = {p: [(t, m) for t, m in _fired(aw, f"every-{p}") if t >= steady]
             for p in ("all", "once", "skip")}
    print("stopped", stopped, "restarted", restarted)
    for p, f in every.items():
        print(p, [(t.strftime("%S"), m) for t, m in f])
    times = {p: [t for t, _ in f] for p, f in every.items()}
    missed = {p: [t for t, m in f if m] for p, f in every.items()}
    for p, f in every.items():
        # The downtime, as each schedule's on-time firings bracket it (its
        # passes after the restart may come a little apart from the others').
        before = max(t for t, m in f if not m and t <= stopped)
        after = min(t for t, m in f if not m and t > restarted)
        assert all(before < t < after for t in missed[p]), (p, missed[p])
    # all: every second from the first to the last, the downtime's as catch-up.
    assert _gaps(times["all"]) == [0] * (len(times["all"]) - 1), times["all"]
    assert len(missed["all"]) >= 3
    # once: one run for the whole gap, the rest of it missing.
    assert len(missed["once"]) == 1, missed["once"]
    assert max(_gaps(times["once"])) >= 2
    # skip: nothing for the downtime; a hole of at least three seconds.
    assert missed["skip"] == []
    assert max(_gaps(times["skip"])) >= 3
    # Exactly one run per fire time: one run_created each, no fire time twice.
    for p in every:
        assert len(set(times[p])) == len(times[p])
