"""One real fault at a time: heartbeats and fencing,
warm shutdown, Redis restarts and outages, Postgres restarts, poison laps and
hung tools. Each test runs real ``celery -A agent_worker.tasks worker`` processes against a
private Postgres and Redis (tests/chaos/conftest.py) that it may restart."""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

from agent_worker.api import AgentWorker
from agent_worker.store.base import RunRecord
from agent_worker.store.db import make_engine
from tests.chaos.conftest import PgStop, PrivatePostgres, PrivateRedis
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.principals import acting
from tests.support import TEST_POOL, Fleet, Proc, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
THREADS = TEST_POOL == "threads"


def _kinds(aw: AgentWorker, run_id: str) -> Counter[str]:
    return Counter(e.kind for e in aw.events(run_id))


def _owned_by(run: RunRecord, worker: Proc) -> bool:
    """Whether one of ``worker``'s pool children holds the run's lease
    (owners look like ``host:pid:nonce``)."""
    if run.status != "running" or not run.lease_owner:
        return False
    return int(run.lease_owner.split(":")[1]) in worker.lap_pids()


def _lap_in_flight_on(aw: AgentWorker, run_id: str, worker: Proc, min_lap: int = 0) -> RunRecord:
    def check() -> RunRecord | None:
        run = aw.get_run(run_id)
        return run if run.lap >= min_lap and _owned_by(run, worker) else None

    found: RunRecord = wait_for(check, timeout=90, interval=0.05,
                                what=f"a lap of {run_id} in flight on pid {worker.pid}")
    return found


def _lap_message_counts(aw: AgentWorker, run_id: str) -> Counter[int]:
    return Counter(m.lap for m in aw.messages(run_id))


def assert_loop_run_whole(aw: AgentWorker, run_id: str, laps: int) -> None:
    """The ``loop`` agent's run: every lap committed once, each with exactly its
    assistant message and its tool result (no half lap, none twice)."""
    assert_laps_exactly_once(aw, run_id, laps)
    assert _lap_message_counts(aw, run_id) == Counter(
        {0: 1, **{k: 2 for k in range(1, laps)}, laps: 1})


def assert_snapshot_consistent(database_url: str) -> None:
    """In one snapshot: each run's row, checkpoints, commit events and messages
    agree, so no reader can ever observe part of a lap."""
    engine = make_engine(database_url, isolation_level="REPEATABLE READ")  # all tenants
    try:
        with engine.connect() as c:
            bad = c.execute(text("""
                SELECT r.id, r.next_lap,
                       (SELECT max(lap) FROM checkpoints k WHERE k.run_id = r.id) AS ckpt,
                       (SELECT count(*) FROM checkpoints k WHERE k.run_id = r.id) AS n_ckpt,
                       (SELECT count(*) FROM events e WHERE e.run_id = r.id
                          AND e.kind = 'lap_committed') AS commits,
                       (SELECT count(*) FROM messages m WHERE m.run_id = r.id
                          AND m.lap > 0 AND m.lap < r.next_lap AND m.body->>'role' = 'tool')
                          AS tool_msgs
                FROM runs r""")).all()
    finally:
        engine.dispose()
    for row in bad:
        committed = row.next_lap - 1
        assert row.ckpt == committed and row.n_ckpt == committed + 1, row
        assert row.commits == committed, row
        # ``loop``: one tool result per committed lap except the final answer.
        assert row.tool_msgs in (committed, committed - 1), row


# --- 1. heartbeats and fencing --------------------------------------------------


def test_heartbeat_keeps_a_lap_slower_than_the_lease_alive(aw: AgentWorker,
                                                           fleet: Fleet) -> None:
    """A tool three lease TTLs long: the heartbeat renews the lease, so the
    sweeper (running all along) never reclaims it and the lap commits once."""
    ttl = float(fleet.env["AGENT_WORKER_LEASE_TTL_SECONDS"])
    fleet.worker(concurrency=1)
    fleet.worker(concurrency=1)  # idle, ready to steal the lap if the lease lapsed
    fleet.beat()
    run = aw.start_run("loop", {"laps": 2, "pause": 3 * ttl})
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_loop_run_whole(aw, run.id, 2)
    assert done.recoveries == 0
    assert "recovered" not in _kinds(aw, run.id)
    slow = next(e for e in aw.events(run.id) if e.kind == "lap_committed" and e.lap == 1)
    assert slow.data is not None
    assert slow.data["trace"][-1]["ms"] > 3 * ttl * 1000, "the slow lap was not slow"


def test_stopped_worker_is_reclaimed_and_cannot_commit_when_it_returns(
        aw: AgentWorker, fleet: Fleet) -> None:
    """SIGSTOP freezes a worker mid-lap (heartbeats stop, sockets stay open):
    after the lease TTL another worker takes the lap over; SIGCONT lets the
    frozen one finish its lap, and the fenced commit turns it away."""
    frozen = fleet.worker(concurrency=1)
    fleet.beat()
    run = aw.start_run("loop", {"laps": 6, "pause": 2.0})
    stuck = _lap_in_flight_on(aw, run.id, frozen, min_lap=1).next_lap
    frozen.kill(signal.SIGSTOP)
    try:
        fleet.worker(concurrency=1)
        wait_for(lambda: aw.get_run(run.id).next_lap > stuck, timeout=90,
                 what=f"lap {stuck} committed by the other worker")
        assert "recovered" in _kinds(aw, run.id)
    finally:
        frozen.kill(signal.SIGCONT)
    # The thawed worker finishes its copy of lap ``stuck`` and is fenced off.
    wait_for(lambda: "'lost'" in frozen.log.read_text(errors="replace"), timeout=90,
             what="the thawed worker's lap to end as 'lost'")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_loop_run_whole(aw, run.id, 6)
    assert done.recoveries >= 1


# --- 2. deploys -------------------------------------------------------------------


@pytest.mark.parametrize("grace", [None, 3.0], ids=["soft-timeout", "sigkill-after-grace"])
def test_warm_shutdown_hands_the_lap_back_promptly(aw: AgentWorker, fleet: Fleet,
                                                   grace: float | None) -> None:
    """SIGTERM (remapped to SIGQUIT, as in deploy/) to a worker mid-lap: it
    hands the lap back after the soft-shutdown timeout and exits, and another
    worker completes the lap within seconds, not after the broker's visibility
    timeout. With ``grace`` shorter than the soft timeout the platform SIGKILLs
    the worker first (nothing handed back): the lease and the sweeper still
    bring the lap back as quickly."""
    soft = 2.0 if grace is None else 20.0
    leaving = fleet.worker(concurrency=1, REMAP_SIGTERM="SIGQUIT",
                           AGENT_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS=str(soft))
    fleet.beat()
    pause = 6.0
    run = aw.start_run("loop", {"laps": 3, "pause": pause})
    lap = _lap_in_flight_on(aw, run.id, leaving).next_lap
    fleet.worker(concurrency=1)
    sent = time.monotonic()
    os.kill(leaving.pid, signal.SIGTERM)  # the platform signals the main process only
    assert leaving.popen is not None
    if grace is None:
        leaving.popen.wait(timeout=soft + 30)
    else:
        time.sleep(grace)  # the platform's grace period (the fault itself)
        assert leaving.alive(), "the worker left before its soft-shutdown timeout"
        leaving.kill(signal.SIGKILL)
    exited = time.monotonic() - sent
    wait_for(lambda: aw.get_run(run.id).next_lap > lap, timeout=90,
             what=f"lap {lap} completed by the remaining worker")
    recovered = time.monotonic() - sent
    print(f"warm shutdown: worker left after {exited:.1f}s, lap {lap} recovered after "
          f"{recovered:.1f}s")
    done = aw.wait(run.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert_loop_run_whole(aw, run.id, 3)
    if grace is None:
        assert exited < soft + 15, f"worker took {exited:.1f}s to leave"
        log = leaving.log.read_text(errors="replace")
        if THREADS:
            # No pool child to stop: the thread finishes its lap and commits it
            # (a lap longer than the platform's grace is the SIGKILL case below).
            assert "succeeded in" in log, "the lap was neither finished nor handed back"
        else:
            assert "Restoring 1 unacknowledged message" in log, "the lap was not handed back"
    # Claimable once the leaving child's lease lapses (the sweeper re-sends it),
    # then re-run: bounded by the settings, nowhere near the broker's visibility
    # timeout (7200 s).
    ttl = float(fleet.env["AGENT_WORKER_LEASE_TTL_SECONDS"])
    bound = min(soft, grace or soft) + ttl + pause + 15
    assert recovered < bound, f"lap {lap} took {recovered:.1f}s to recover (bound {bound}s)"


# --- 3. Redis ---------------------------------------------------------------------


def _start_loops(aw: AgentWorker, n: int, laps: int, pause: float = 0.3) -> list[str]:
    return [aw.start_run("loop", {"laps": laps, "pause": pause}).id for _ in range(n)]


def _all_progressed(aw: AgentWorker, ids: list[str], lap: int) -> bool:
    return all(aw.get_run(i).lap >= lap for i in ids)


def _finish_all(aw: AgentWorker, ids: list[str], laps: int) -> None:
    for run_id in ids:
        done = aw.wait(run_id, timeout=180)
        assert done.status == "succeeded", (run_id, done.status, done.error_detail)
        assert_loop_run_whole(aw, run_id, laps)


def _laps_resent_by_sweeper(fleet: Fleet) -> int:
    """Laps the sweeper sent, summed from the workers' task-result log lines."""
    sent = re.compile(r"agent_worker\.sweep\[[^]]+\] succeeded in [\d.e-]+s: (\d+)")
    return sum(int(n) for p in fleet.procs if p.log.exists()
               for n in sent.findall(p.log.read_text(errors="replace")))


#: kombu 5.7's crash on a lost Redis connection (README, "Keeping workers
#: running"): no setting or release avoids it, so every supervisor in deploy/
#: restarts a worker that exits. These tests do the same, for that crash only.
KOMBU_RESTORE_CRASH = "Unrecoverable error: AttributeError(\"'NoneType' object has no " \
    "attribute 'hostname'\")"


def _supervised_until_finished(aw: AgentWorker, fleet: Fleet, workers: list[Proc],
                               ids: list[str]) -> list[Proc]:
    """Restart, like systemd or Kubernetes would, a worker that exited with the
    known kombu crash (any other exit fails the test) until every run has
    finished; returns the workers that crashed."""
    crashed: list[Proc] = []

    def supervise() -> bool:
        for i, w in enumerate(workers):
            if not w.alive():
                assert KOMBU_RESTORE_CRASH in w.log.read_text(errors="replace"), \
                    f"worker {w.pid} died instead of reconnecting"
                crashed.append(w)
                workers[i] = fleet.worker(concurrency=1)
        return all(aw.get_run(r).status == "succeeded" for r in ids)

    wait_for(supervise, timeout=180, interval=0.5, what="every run finished")
    if crashed:
        print(f"kombu's restore crash took down {len(crashed)} worker(s); restarted")
    return crashed


@pytest.mark.parametrize("private_redis", [{"appendonly": False}], indirect=True)
def test_redis_restart_without_aof_loses_messages_and_the_sweeper_resends(
        aw: AgentWorker, fleet: Fleet, private_redis: PrivateRedis) -> None:
    workers = [fleet.worker(concurrency=2), fleet.worker(concurrency=1)]
    beat = fleet.beat()
    ids = _start_loops(aw, 5, laps=12)
    wait_for(lambda: _all_progressed(aw, ids, 2), timeout=120, what="every run at lap 2")
    assert private_redis.message_count() > 0, "nothing in Redis to lose"
    private_redis.restart()
    _supervised_until_finished(aw, fleet, workers, ids)
    _finish_all(aw, ids, 12)
    assert beat.alive(), "beat died instead of reconnecting"
    assert _laps_resent_by_sweeper(fleet) > 0, "the sweeper never re-sent a lost lap"


def test_redis_unreachable_for_seconds_then_workers_reconnect(
        aw: AgentWorker, fleet: Fleet, private_redis: PrivateRedis) -> None:
    workers = [fleet.worker(concurrency=2), fleet.worker(concurrency=1)]
    beat = fleet.beat()
    ids = _start_loops(aw, 5, laps=12)
    wait_for(lambda: _all_progressed(aw, ids, 2), timeout=120, what="every run at lap 2")
    private_redis.restart(down_seconds=5)
    _supervised_until_finished(aw, fleet, workers, ids)
    _finish_all(aw, ids, 12)
    assert beat.alive(), "beat died instead of reconnecting"


# --- 4. Postgres ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["fast", "immediate", "outage"])
def test_postgres_restart_while_laps_run(aw: AgentWorker, fleet: Fleet, database_url: str,
                                         private_pg: PrivatePostgres, how: str) -> None:
    """Sessions killed (``fast``), a crash with WAL recovery (``immediate``), or
    Postgres gone for 4 s: laps in flight fail their transactions and retry,
    nothing half-done is ever visible, and no process needs a restart."""
    workers = [fleet.worker(concurrency=2), fleet.worker(concurrency=1)]
    beat = fleet.beat()
    ids = _start_loops(aw, 5, laps=12, pause=0.2)
    wait_for(lambda: _all_progressed(aw, ids, 2), timeout=120, what="every run at lap 2")
    if how == "outage":
        private_pg.outage(4.0, "fast")
    else:
        mode: PgStop = "fast" if how == "fast" else "immediate"
        private_pg.restart(mode)
    assert_snapshot_consistent(database_url)
    _finish_all(aw, ids, 12)
    assert_snapshot_consistent(database_url)
    assert all(p.alive() for p in [*workers, beat]), "a process died instead of reconnecting"


# --- 5. poison laps ---------------------------------------------------------------


def test_poison_lap_is_dead_lettered_and_retry_resumes_from_the_checkpoint(
        aw: AgentWorker, fleet: Fleet, tmp_path: Path) -> None:
    attempts = 3
    fleet.worker(concurrency=2, AGENT_WORKER_MAX_LAP_ATTEMPTS=str(attempts))
    fleet.beat()
    marker = tmp_path / "fixed"
    fragile = aw.start_run("fragile", {"laps": 4, "at": 3, "marker": str(marker)})
    poison = aw.start_run("poison", {})

    for run_id, lap, message in ((fragile.id, 2, "does not exist yet"),
                                 (poison.id, 0, "boom")):
        failed = aw.wait(run_id, timeout=120)
        assert failed.status == "failed", failed
        assert failed.error_code == "lap_error"
        assert failed.error_message is not None and message in failed.error_message
        assert failed.error_detail is not None
        assert "Traceback" in failed.error_detail and "RuntimeError" in failed.error_detail
        assert failed.lap == lap, "a failing lap must not commit"
        kinds = _kinds(aw, run_id)
        assert kinds["retry"] == attempts - 1 and kinds["failing"] == 1, kinds
        assert any(r.id == run_id for r in aw.list_runs(status="failed", limit=1000))
    # One retry event per failed attempt, each attempt held back by the backoff.
    retries = [e for e in aw.events(fragile.id) if e.kind == "retry"]
    assert [(e.data or {}).get("attempt") for e in retries] == list(range(1, attempts))
    backoff = float(fleet.env["AGENT_WORKER_RETRY_BACKOFF_SECONDS"])
    gaps = [(b.created_at - a.created_at).total_seconds() for a, b in itertools.pairwise(retries)]
    assert all(g >= backoff for g in gaps), gaps

    marker.touch()  # the operator's fix
    acting(aw, "test").retry(fragile.id)
    done = aw.wait(fragile.id, timeout=120)
    assert done.status == "succeeded", done.error_detail
    assert done.result == {"laps": 4}
    assert done.error_code is None
    # Laps 1-2 were not re-run: each lap, before and after the failure, committed once.
    assert_laps_exactly_once(aw, fragile.id, 5)
    assert _kinds(aw, fragile.id)["retried"] == 1


# --- 6. timeouts ------------------------------------------------------------------


@pytest.mark.skipif(THREADS,
                    reason="the threads pool has no Celery time limits: a lap past "
                    "AGENT_WORKER_LAP_TIME_LIMIT_SECONDS loses its lease instead "
                    "(tests/engine/test_heartbeat_owned.py)")
def test_hung_tool_is_interrupted_by_the_lap_time_limit(aw: AgentWorker, fleet: Fleet,
                                                         tmp_path: Path) -> None:
    """A tool hanging for two minutes against a 2 s soft limit: interrupted and
    retried (and, when it hangs every time, failed), never held for long."""
    hang = 120.0
    fleet.worker(concurrency=2, AGENT_WORKER_LAP_SOFT_TIME_LIMIT_SECONDS="2",
                 AGENT_WORKER_LAP_TIME_LIMIT_SECONDS="8", AGENT_WORKER_MAX_LAP_ATTEMPTS="2")
    fleet.beat()
    started = time.monotonic()
    once = aw.start_run("fragile", {"laps": 2, "at": 1, "tool": "hang", "seconds": hang,
                                    "marker": str(tmp_path / "once")})
    always = aw.start_run("fragile", {"laps": 2, "at": 1, "tool": "hang", "seconds": hang,
                                      "always": True, "marker": str(tmp_path / "always")})
    cured = aw.wait(once.id, timeout=90)
    assert cured.status == "succeeded", cured.error_detail
    assert_laps_exactly_once(aw, once.id, 3)
    retry = next(e for e in aw.events(once.id) if e.kind == "retry")
    assert "SoftTimeLimitExceeded" in (retry.data or {}).get("error", ""), retry.data
    failed = aw.wait(always.id, timeout=90)
    assert failed.status == "failed"
    assert failed.error_detail is not None and "SoftTimeLimitExceeded" in failed.error_detail
    assert failed.lap == 0
    assert time.monotonic() - started < hang / 2, "a hung tool held its run"
