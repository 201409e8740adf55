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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_worker.api import AgentWorker
from tests.support import Fleet, Proc, logs, wait_for

pytestmark = pytest.mark.integration

GRACE = 3.0
TIMING = {"AGENT_WORKER_SCHEDULE_INTERVAL_SECONDS": "0.25",
          "AGENT_WORKER_SCHEDULE_GRACE_SECONDS": str(GRACE)}
SECOND = timedelta(seconds=1)


def _beat(fleet: Fleet, tmp_path: Path, n: int) -> Proc:
    """A beat with a log of its own (``Fleet.beat`` shares one)."""
    p = Proc([sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel", "INFO",
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


def _gaps(times: list[datetime]) -> list[int]:
    """Missing fire times between consecutive ones."""
    return [int((b - a) / SECOND) - 1 for a, b in itertools.pairwise(times)]


def test_two_beats_then_a_downtime_fire_what_each_catchup_policy_promises(
        aw: Any, fleet: Fleet, tmp_path: Path) -> None:
    store = aw.rt.store
    worker = fleet.worker(concurrency=2, **TIMING)
    beats = [_beat(fleet, tmp_path, 1), _beat(fleet, tmp_path, 2)]
    # Schedules made once the fleet runs passes: its start-up is no downtime.
    wait_for(lambda: "fire_schedules" in worker.log.read_text()
             and "succeeded" in worker.log.read_text(), timeout=90, what="a firing pass")
    for n in (1, 2):
        assert "agent_worker.fire_schedules" in (tmp_path / f"beat{n}.log").read_text()
    for policy in ("all", "once", "skip"):
        aw.schedule(f"every-{policy}", "loop", "* * * * * *", {"laps": 0}, catchup=policy,
                    catchup_limit=100, overlap="allow")
    try:
        wait_for(lambda: sum(not m for _, m in _fired(aw, "every-all")) >= 3, timeout=90,
                 what="three on-time firings with two beats")
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

    every = {p: _fired(aw, f"every-{p}") for p in ("all", "once", "skip")}
    print("stopped", stopped, "restarted", restarted)
    for p, f in every.items():
        print(p, [(t.strftime("%S"), m) for t, m in f])
    # The downtime, as the all-policy's on-time firings bracket it.
    before = max(t for t, m in every["all"] if not m and t <= stopped)
    after = min(t for t, m in every["all"] if not m and t > restarted)
    times = {p: [t for t, _ in f] for p, f in every.items()}
    missed = {p: [t for t, m in f if m] for p, f in every.items()}
    # all: every second from the first to the last, the downtime's as catch-up.
    assert _gaps(times["all"]) == [0] * (len(times["all"]) - 1), times["all"]
    assert len(missed["all"]) >= 3
    assert all(before < t < after for t in missed["all"]), missed["all"]
    # once: one run for the whole gap, the rest of it missing.
    assert len(missed["once"]) == 1, missed["once"]
    assert before < missed["once"][0] < after
    assert max(_gaps(times["once"])) >= 2
    # skip: nothing for the downtime; a hole of at least three seconds.
    assert missed["skip"] == []
    assert max(_gaps(times["skip"])) >= 3
    # Exactly one run per fire time: one run_created each, no fire time twice.
    for p in every:
        assert len(set(times[p])) == len(times[p])
