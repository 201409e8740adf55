"""agent-worker on the shared workload: in-process, through real Celery workers,
storage, resume cost, throughput, recovery after SIGKILL, and a profile.

Runs start through the public ``start_run``; the benchmark then puts the
workload's five-item plan into the lap-0 checkpoint before the first lap is
sent (the engine carries the plan forward every lap; it has no hook for an
agent to rewrite it, so ours stores the plan each lap without changing it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select, text, update

from agent_worker.api import AgentWorker
from agent_worker.core.checkpoint import load_checkpoint
from agent_worker.core.settings import get_settings
from agent_worker.inprocess import InProcessWorker
from agent_worker.runtime import Runtime
from agent_worker.store.base import DueLap, RunRecord
from agent_worker.store.migrate import upgrade
from agent_worker.store.rows import checkpoints, runs
from agent_worker.store.sql import SqlStore
from bench.agents import BENCH_AGENT
from bench.common import (
    Proc,
    celery_beat,
    celery_worker,
    log,
    repeat_ms,
    sa_url,
    summary,
    wait_for,
)
from bench.workload import AGENT_NAME, plan, run_id

OWNERS = {"runs": "id", "checkpoints": "run_id", "messages": "run_id", "effects": "run_id",
          "events": "run_id", "approvals": "run_id", "signals": "run_id"}
"""Every table a run writes to, and the column naming the run."""


class Deferred:
    """A dispatcher that, after ``hold()``, keeps sends until ``flush()``: lets the
    benchmark set the plan before a worker can claim lap 1, and send 200 runs'
    first laps in one burst. Otherwise it passes sends straight through."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.held: list[DueLap] | None = None

    def hold(self) -> None:
        if self.held is None:
            self.held = []

    def send(self, lap: DueLap) -> None:
        if self.held is None:
            self.target.send(lap)
        else:
            self.held.append(lap)

    def flush(self) -> None:
        held, self.held = self.held or [], None
        for lap in held:
            self.target.send(lap)


def _with_plan(store: SqlStore, rid: str) -> None:
    with store.engine.begin() as conn:
        state = conn.execute(select(checkpoints.c.state).where(
            checkpoints.c.run_id == rid, checkpoints.c.lap == 0)).scalar_one()
        conn.execute(update(checkpoints).where(
            checkpoints.c.run_id == rid, checkpoints.c.lap == 0).values(
            state={**state, "plan": plan(0)}))


def start(aw: AgentWorker, rid: str) -> None:
    """Create ``rid`` with the workload's plan; its first lap is held until the
    caller flushes the ``Deferred`` dispatcher."""
    assert isinstance(aw.rt.dispatcher, Deferred)
    aw.rt.dispatcher.hold()
    aw.start_run(AGENT_NAME, {"task": "work through the plan"}, run_id=rid)
    assert isinstance(aw.rt.store, SqlStore)
    _with_plan(aw.rt.store, rid)


def check_finished(store: SqlStore, rid: str, n: int) -> None:
    """Fail loudly unless the run committed exactly laps 1..n and succeeded."""
    run = store.get_run(rid)
    if run is None or run.status != "succeeded" or run.next_lap != n + 1:
        raise RuntimeError(f"run {rid}: expected succeeded after {n} laps, got "
                           f"{run.status if run else None} at next_lap "
                           f"{run.next_lap if run else None}: "
                           f"{run.error_message if run else ''}")
    laps = [lap for lap, _, _ in store.list_checkpoints(rid)]
    if laps != list(range(n + 1)):
        raise RuntimeError(f"run {rid}: checkpoints {laps[:5]}... are not 0..{n}")


# --- in-process ------------------------------------------------------------------

def inprocess_worker(url: str) -> tuple[InProcessWorker, Deferred]:
    w = InProcessWorker(sa_url(url))
    deferred = Deferred(w.queue)
    w.rt.dispatcher = deferred
    return w, deferred


def run_inprocess(w: InProcessWorker, deferred: Deferred, rid: str, n: int, *,
                  laps_only: bool = False) -> float:
    """One whole run in this process; seconds from start_run to the run's end,
    not counting the benchmark's plan write.

    ``run_until_idle`` ends with a sweeper pass once the queue is empty (the
    in-process mode's own sweeper), timed with the run. ``laps_only`` stops at
    the run's ``n`` laps instead, before that pass: the laps alone, for
    ``bench.scale``, which times the sweep on its own (a lap that fell back
    on the sweeper still gets its pass, and ``check_finished`` holds either
    way)."""
    deferred.hold()
    t0 = time.perf_counter()
    w.start_run(AGENT_NAME, {"task": "work through the plan"}, run_id=rid)
    started = time.perf_counter() - t0
    assert isinstance(w.rt.store, SqlStore)
    _with_plan(w.rt.store, rid)
    deferred.flush()
    t1 = time.perf_counter()
    if laps_only:
        w.run_until_idle(max_laps=n)
    else:
        w.run_until_idle()
    elapsed = started + time.perf_counter() - t1
    check_finished(w.rt.store, rid, n)
    return elapsed


class InProcess:
    """agent-worker's ``InProcessWorker`` on Postgres, as a ``System``."""

    name = "ours"
    owners: Mapping[str, str] = OWNERS

    def __init__(self, url: str, *, laps_only: bool = False) -> None:
        self.url, self.laps_only = url, laps_only
        self.w, self.deferred = inprocess_worker(url)
        self.run(run_id("warm", 5, 0), 5)  # connections, caches, plans

    def run(self, rid: str, n: int) -> float:
        return run_inprocess(self.w, self.deferred, rid, n, laps_only=self.laps_only)

    def close(self) -> None:
        self.w.rt.store.engine.dispose()  # type: ignore[attr-defined]


# --- resume cost -------------------------------------------------------------------

def bench_load(url: str, run_ids: dict[int, str], samples: int) -> dict[str, Any]:
    """Cost of loading what lap ``n`` resumes from, on a finished ``n``-lap run.

    ``claim``: the store's claim transaction for lap n (fenced UPDATE, the
    checkpoint of lap n-1, the message window, the lap's effects, one commit);
    the run row is put back to "queued at lap n" before each sample.
    ``read``: the same data through the read-only history API.
    """
    store = SqlStore(sa_url(url))
    window = BENCH_AGENT.window_messages
    out: dict[str, Any] = {}
    for n, rid in run_ids.items():
        def reset(lap: int = n, rid: str = rid) -> None:
            with store.engine.begin() as c:
                c.execute(update(runs).where(runs.c.id == rid).values(
                    status="queued", next_lap=lap, lease_owner=None, lease_expires_at=None,
                    wake_at=None, lap_attempts=0))

        def claim(lap: int = n, rid: str = rid) -> None:
            got = store.claim(rid, lap, owner="bench", now=datetime.now(UTC),
                              lease_seconds=30, window_messages=window)
            if got is None or len(got.window) < min(window, 2 * lap - 1):
                raise RuntimeError(f"claim of {rid} lap {lap} loaded {got and len(got.window)}")

        def read(lap: int = n, rid: str = rid) -> None:
            state = store.get_checkpoint(rid, lap - 1)
            assert state is not None
            ckpt = load_checkpoint(state)
            store.list_messages(rid, start=max(ckpt.message_count - window, 0))

        claims = []
        for _ in range(samples):
            reset()
            t0 = time.perf_counter()
            claim()
            claims.append((time.perf_counter() - t0) * 1e3)
        with store.engine.begin() as c:
            c.execute(update(runs).where(runs.c.id == rid).values(
                status="succeeded", next_lap=n + 1, lease_owner=None, lease_expires_at=None))
        out[str(n)] = {"claim_ms": summary(claims), "read_ms": repeat_ms(read, samples)}
        log(f"ours load at lap {n}: claim {out[str(n)]['claim_ms']['median']:.2f} ms, "
            f"read {out[str(n)]['read_ms']['median']:.2f} ms")
    store.engine.dispose()
    return out


# --- Celery ------------------------------------------------------------------------

def worker_env(url: str, broker: str, **extra: str) -> dict[str, str]:
    from bench.common import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=sa_url(url),
               AGENT_WORKER_BROKER_URL=broker, AGENT_WORKER_AGENT_MODULES="bench.agents",
               **extra)
    return env


def celery_client(url: str, broker: str) -> tuple[AgentWorker, Deferred]:
    """An ``AgentWorker`` in this process that sends laps through Celery (the
    database is migrated first, as a deployment would)."""
    upgrade(sa_url(url))
    os.environ.update(AGENT_WORKER_DATABASE_URL=sa_url(url), AGENT_WORKER_BROKER_URL=broker,
                      AGENT_WORKER_AGENT_MODULES="bench.agents")
    get_settings.cache_clear()
    from agent_worker.tasks import app
    from agent_worker.tasks.dispatch import CeleryDispatcher

    app.conf.update(broker_url=broker)
    deferred = Deferred(CeleryDispatcher())
    return AgentWorker(Runtime(store=SqlStore(sa_url(url)), dispatcher=deferred,
                               settings=get_settings())), deferred


def _finished(store: SqlStore, rids: list[str]) -> bool:
    with store.engine.connect() as c:
        left = c.execute(text("SELECT count(*) FROM runs WHERE id = ANY(:ids) AND status "
                              "NOT IN ('succeeded', 'failed', 'cancelled')"),
                         {"ids": rids}).scalar_one()
    return int(left) == 0


def _span(store: SqlStore, rids: list[str]) -> tuple[int, float]:
    """Laps committed by ``rids`` and the seconds between the first and last commit."""
    with store.engine.connect() as c:
        row = c.execute(text(
            "SELECT count(*), extract(epoch FROM max(created_at) - min(created_at)) "
            "FROM checkpoints WHERE run_id = ANY(:ids) AND lap > 0"), {"ids": rids}).one()
    return int(row[0]), float(row[1] or 0.0)


def _run_celery(aw: AgentWorker, deferred: Deferred, rid: str, n: int, timeout: float) -> float:
    store = aw.rt.store
    assert isinstance(store, SqlStore)
    start(aw, rid)
    sent = datetime.now().astimezone()
    deferred.flush()
    wait_for(lambda: _finished(store, [rid]), timeout, what=f"run {rid}", interval=0.05)
    check_finished(store, rid, n)
    run = store.get_run(rid)
    assert run is not None and run.finished_at is not None
    return (run.finished_at - sent).total_seconds()


class ViaCelery:
    """agent-worker through one real Celery worker process (prefork, concurrency
    1), one run at a time: send, Redis, claim, lap, commit, send the next lap."""

    name = "celery"
    owners: Mapping[str, str] = OWNERS

    def __init__(self, url: str, broker: str, logdir: Path) -> None:
        self.url = url
        self.aw, self.deferred = celery_client(url, broker)
        self.worker = celery_worker(worker_env(url, broker), 1, "bench-c1",
                                    logdir / "celery-c1.log")
        try:
            self.run(run_id("warm", 5, 0), 5)
        except BaseException:
            self.close()
            raise

    def run(self, rid: str, n: int) -> float:
        return _run_celery(self.aw, self.deferred, rid, n, timeout=120 + n)

    def close(self) -> None:
        self.worker.stop()
        self.aw.rt.store.engine.dispose()  # type: ignore[attr-defined]


def bench_throughput(url: str, broker: str, processes: tuple[int, ...], runs_n: int,
                     laps: int, repeats: int, prefix: str, logdir: Path) -> dict[str, Any]:
    """Laps per second over ``runs_n`` concurrent runs of ``laps`` laps, with one
    Celery worker of ``k`` prefork processes for each ``k`` in ``processes``.

    All runs are created first and their first laps sent in one burst, so the
    benchmark process is idle (polling twice a second) while workers run."""
    aw, deferred = celery_client(url, broker)
    store = aw.rt.store
    assert isinstance(store, SqlStore)
    out: dict[str, Any] = {}
    try:
        for k in processes:
            worker = celery_worker(worker_env(url, broker), k, f"bench-tp{k}",
                                   logdir / f"celery-tp{k}.log")
            try:
                _run_celery(aw, deferred, run_id(f"{prefix}w{k}", 3, 0), 3, timeout=120)
                rates = []
                for rep in range(repeats):
                    rids = [run_id(f"{prefix}k{k}r{rep}", laps, i) for i in range(runs_n)]
                    for rid in rids:
                        start(aw, rid)
                    deferred.flush()
                    wait_for(partial(_finished, store, rids), 60 + runs_n * laps / 5,
                             what=f"{runs_n} runs on {k} processes", interval=0.5)
                    count, seconds = _span(store, rids)
                    if count != runs_n * laps:
                        raise RuntimeError(f"expected {runs_n * laps} laps, counted {count}")
                    rates.append(count / seconds)
                out[str(k)] = {"laps_per_s": summary(rates)}
                log(f"ours throughput {k} proc: {summary(rates)['median']:.0f} laps/s")
            finally:
                worker.stop()
        return out
    finally:
        store.engine.dispose()


def bench_recovery(url: str, broker: str, repeats: int, prefix: str,
                   logdir: Path) -> dict[str, Any]:
    """Seconds from SIGKILL of the worker running a lap to the next committed
    lap of that run, with a second worker and a beat (lease TTL 3 s, sweep
    every 0.5 s: recovery is bounded by TTL + sweep interval by design).

    The victim's lap is made slow (each lap's tool sleeps 0.3 s via the
    ``bench-slow`` env) so the kill lands mid-lap, the case that waits for the
    lease."""
    env = worker_env(url, broker, AGENT_WORKER_LEASE_TTL_SECONDS="3",
                     AGENT_WORKER_HEARTBEAT_INTERVAL_SECONDS="1",
                     AGENT_WORKER_SWEEP_INTERVAL_SECONDS="0.5",
                     AGENT_WORKER_QUEUED_OVERDUE_SECONDS="5",
                     AGENT_WORKER_BENCH_TOOL_SLEEP="0.3")
    aw, deferred = celery_client(url, broker)
    store = aw.rt.store
    assert isinstance(store, SqlStore)
    beat = celery_beat(env, logdir / "beat.log")
    procs: list[Proc] = [celery_worker(env, 1, f"bench-rec{i}", logdir / f"rec{i}.log")
                         for i in range(2)]
    try:
        _run_celery(aw, deferred, run_id(f"{prefix}w", 3, 0), 3, timeout=120)
        gaps = []
        for rep in range(repeats):
            rid = run_id(f"{prefix}r{rep}", 8, 0)
            start(aw, rid)
            deferred.flush()
            run = wait_for(partial(_running, store, rid, 3), 60, what="lap 3 running",
                           interval=0.01)
            victim = _proc_of(procs, int(str(run.lease_owner).split(":")[1]))
            killed_at = datetime.now(UTC)
            victim.kill(signal.SIGKILL)
            procs.remove(victim)
            committed = wait_for(partial(_committed_at, store, rid, run.next_lap), 60,
                                 what=f"lap {run.next_lap} recommitted", interval=0.05)
            gaps.append((committed - killed_at).total_seconds())
            log(f"ours recovery #{rep}: {gaps[-1]:.2f} s")
            procs.append(celery_worker(env, 1, f"bench-rec{rep}", logdir / f"rec-re{rep}.log"))
            wait_for(partial(_finished, store, [rid]), 120, what="recovered run to finish",
                     interval=0.05)
        return {"seconds": summary(gaps), "lease_ttl_s": 3.0, "sweep_interval_s": 0.5}
    finally:
        for p in procs:
            p.stop()
        beat.stop()
        store.engine.dispose()


def _running(store: SqlStore, rid: str, lap: int) -> RunRecord | None:
    """The run while a worker holds lap ``lap`` or later, else ``None``."""
    run = store.get_run(rid)
    return run if run is not None and run.next_lap >= lap and run.lease_owner else None


def _proc_of(procs: list[Proc], pid: int) -> Proc:
    """The worker whose process group holds ``pid`` (a pool child)."""
    group = os.getpgid(pid)
    return next(p for p in procs if p.popen is not None and p.popen.pid == group)


def _committed_at(store: SqlStore, rid: str, lap: int) -> datetime | None:
    with store.engine.connect() as c:
        at: datetime | None = c.execute(select(checkpoints.c.created_at).where(
            checkpoints.c.run_id == rid, checkpoints.c.lap == lap)).scalar()
    return at


# --- profile -------------------------------------------------------------------------

def profile_inprocess(url: str, n: int, prefix: str, html: Path) -> dict[str, Any]:
    """Profile an in-process run of ``n`` laps with pyinstrument (wall clock);
    per-lap milliseconds of the named steps and of the hottest functions."""
    from pyinstrument import Profiler

    w, deferred = inprocess_worker(url)
    run_inprocess(w, deferred, run_id(f"{prefix}w", 5, 0), 5)
    profiler = Profiler(interval=0.0002)
    profiler.start()
    run_inprocess(w, deferred, run_id(prefix, n, 0), n)
    profiler.stop()
    w.rt.store.engine.dispose()  # type: ignore[attr-defined]
    html.parent.mkdir(parents=True, exist_ok=True)
    html.write_text(profiler.output_html())
    html.with_suffix(".txt").write_text(profiler.output_text(color=False, show_all=False))
    session = profiler.last_session
    assert session is not None
    root = session.root_frame()
    assert root is not None
    total = session.duration
    return {"n": n, "ms_per_lap": total / n * 1e3,
            "steps": _inclusive(root, n, STEPS), "self": _self_times(root, n, 15),
            "html": str(html)}


STEPS: dict[str, Callable[[str, str], bool]] = {
    "claim (store.claim)": lambda f, p: f == "claim" and p.endswith("sql.py"),
    "journal model output": lambda f, p: f == "journal_model_output",
    "commit lap (store.commit_lap)": lambda f, p: f == "commit_lap",
    "heartbeat thread start/stop": lambda f, p: p.endswith("heartbeat.py") and f in (
        "__enter__", "__exit__"),
    "build model request": lambda f, p: f == "build_request",
    "tool call (CallRunner.run)": lambda f, p: f == "run" and p.endswith("calls.py"),
    "checkpoint dump/load": lambda f, p: f in ("dump_checkpoint", "load_checkpoint"),
    "sweep (in-process idle check)": lambda f, p: f == "sweep" and p.endswith("api.py"),
    "psycopg execute (server round trips)": lambda f, p: f in ("execute", "executemany")
    and "psycopg" in p and "sqlalchemy" not in p,
    "commit (COMMIT + fsync wait)": lambda f, p: f == "commit" and "psycopg" in p
    and "sqlalchemy" not in p,
    "SQLAlchemy compile": lambda f, p: f in ("compile", "_compiler") and "sqlalchemy" in p,
    "pydantic validate/dump": lambda f, p: f in (
        "model_validate", "model_dump", "model_dump_json", "model_copy", "__init__")
    and "pydantic" in p,
}


def _walk(frame: Any, ancestors: frozenset[str]) -> Any:
    yield frame, ancestors
    key = f"{frame.function}@{frame.file_path_short or ''}"
    for child in frame.children:
        yield from _walk(child, ancestors | {key})


def _inclusive(root: Any, n: int, steps: dict[str, Callable[[str, str], bool]],
               ) -> dict[str, float]:
    """Per-lap ms of each named step, counting nested/recursive calls once."""
    out = dict.fromkeys(steps, 0.0)
    for name, match in steps.items():
        for frame, ancestors in _walk(root, frozenset()):
            path = frame.file_path_short or frame.file_path or ""
            if match(frame.function, path) and not any(
                    match(a.split("@", 1)[0], a.split("@", 1)[1]) for a in ancestors):
                out[name] += frame.time
    return {k: round(v / n * 1e3, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _self_times(root: Any, n: int, top: int) -> list[dict[str, Any]]:
    """Functions by self time (time spent in them, not in their callees), per lap.
    A frame's ``total_self_time`` already includes its synthetic ``[self]`` leaves."""
    acc: dict[str, float] = {}
    for frame, _ in _walk(root, frozenset()):
        if frame.is_synthetic:
            continue
        key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
        acc[key] = acc.get(key, 0.0) + frame.total_self_time
    ranked = sorted(acc.items(), key=lambda kv: -kv[1])[:top]
    return [{"function": k, "ms_per_lap": round(v / n * 1e3, 3)} for k, v in ranked]


def sql_census(url: str, n: int, prefix: str) -> dict[str, Any]:
    """What one in-process lap sends to Postgres: network round trips (each
    wait of psycopg that touched the socket: statements, BEGIN, COMMIT, pool
    pings; not the autocommit switches and idle rollbacks it settles
    locally), statements by kind and table, commits and pool checkouts.
    Counted at the driver, whichever engine sends them (the store's own or
    the relaxed one of its lap path)."""
    import psycopg
    from sqlalchemy import event

    w, deferred = inprocess_worker(url)
    run_inprocess(w, deferred, run_id(f"{prefix}w", 5, 0), 5)
    engine = w.rt.store.engine  # type: ignore[attr-defined]
    counts = {"round_trips": 0, "statements": 0, "commits": 0, "checkouts": 0}
    kinds: dict[str, int] = {}

    def execute(send: Any) -> Any:
        def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            text_ = (query.as_string(self) if isinstance(query, psycopg.sql.Composable)
                     else query.decode() if isinstance(query, bytes) else str(query))
            kind = _statement_shape(text_)
            kinds[kind] = kinds.get(kind, 0) + 1
            counts["statements"] += 1
            counts["commits"] += kind == "COMMIT"
            return send(self, query, *args, **kwargs)
        return counted

    def commit(send: Any) -> Any:
        def counted(self: Any) -> Any:
            counts["commits"] += 1
            return send(self)
        return counted

    def wait(send: Any) -> Any:
        def on_the_wire(gen: Any) -> Any:  # a generator that yields waits on the socket
            try:
                item = next(gen)
            except StopIteration as done:
                return done.value
            counts["round_trips"] += 1
            while True:
                reply = yield item
                try:
                    item = gen.send(reply)
                except StopIteration as done:
                    return done.value

        def counted(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
            return send(self, on_the_wire(gen), *args, **kwargs)
        return counted

    def on_checkout(*_: Any) -> None:
        counts["checkouts"] += 1

    patched = [(psycopg.Cursor, "execute", execute), (psycopg.Cursor, "executemany", execute),
               (psycopg.Connection, "commit", commit), (psycopg.Connection, "wait", wait)]
    originals = [getattr(cls, name) for cls, name, _ in patched]
    event.listen(engine.pool, "checkout", on_checkout)
    for (cls, name, wrap), send in zip(patched, originals, strict=True):
        setattr(cls, name, wrap(send))
    try:
        run_inprocess(w, deferred, run_id(prefix, n, 0), n)
    finally:
        for (cls, name, _), send in zip(patched, originals, strict=True):
            setattr(cls, name, send)
        event.remove(engine.pool, "checkout", on_checkout)
        engine.dispose()
    per_lap = {k: round(v / n, 2) for k, v in counts.items()}
    per_lap_kinds = {k: round(v / n, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}
    log(f"ours census per lap: {per_lap}")
    return {"n": n, "per_lap": per_lap, "statements_per_lap": per_lap_kinds}


def _statement_shape(sql: str) -> str:
    """``UPDATE runs``, ``INSERT messages``, ``SELECT checkpoints``, ``WITH … UPDATE runs``."""
    import re

    text_ = " ".join(sql.split())
    op = text_.split(" ", 1)[0].upper()
    if op == "WITH":
        m = re.search(r"\b(UPDATE|INSERT INTO|DELETE FROM)\s+(\w+)", text_, re.I)
        return f"WITH .. {m.group(1).split()[0].upper()} {m.group(2)}" if m else "WITH"
    pattern = {"UPDATE": r"^UPDATE\s+(\w+)", "INSERT": r"^INSERT\s+INTO\s+(\w+)",
               "DELETE": r"^DELETE\s+FROM\s+(\w+)"}.get(op, r"\bFROM\s+(\w+)")
    m = re.search(pattern, text_, re.I)
    return f"{op} {m.group(1)}" if m else op
