"""Plumbing every benchmark shares: its own Postgres databases and Redis db on the
shared servers (never restarted), statistics, and the two storage measures.

Storage is measured the same way for every system:

* ``row_bytes``: the stored size of every row a run owns (``pg_column_size`` of
  the row, TOAST-compressed values counted as stored) plus its 4-byte line
  pointer. Exact per run; leaves out indexes and page slack.
* ``disk_bytes``: the growth of ``pg_total_relation_size`` (heap, TOAST and
  indexes) of the system's tables over a batch of runs, divided by the runs.
  What the disk pays; page-granular, so coarse for small batches.
* ``wal_bytes``: the advance of the server's WAL insert position over one run.
  The server is shared, so other sessions' writes can only add to it: the
  minimum over the repeats is the closest to the system's own.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

import psycopg

from agent_worker.core.settings import Settings
from bench.dropping import drop_retrying
from tests.support import Proc as Proc
from tests.support import lock_redis_db
from tests.support import wait_for as wait_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PG_ADMIN = os.environ.get("AGENT_WORKER_BENCH_PG",
                          "postgresql://agent_worker@127.0.0.1:54329/agent_worker")
REDIS = os.environ.get("AGENT_WORKER_BENCH_REDIS", "redis://127.0.0.1:63799")


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as psycopg/libpq wants it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def sa_url(url: str) -> str:
    """A libpq URL as SQLAlchemy wants it (psycopg 3 driver)."""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def create_database(name: str) -> str:
    """A fresh database ``name`` on the shared server; returns its libpq URL."""
    with psycopg.connect(libpq_url(PG_ADMIN), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return libpq_url(PG_ADMIN).rsplit("/", 1)[0] + "/" + name


def drop_database(name: str, *, admin_url: str = PG_ADMIN) -> None:
    """Drop ``name`` (sessions and all) on the server of ``admin_url``, waiting
    out an autovacuum worker on it (``bench.dropping``)."""
    def execute(sql: str) -> None:
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
            conn.execute(sql)

    drop_retrying(execute, name)


def server_settings() -> dict[str, str]:
    """The Postgres settings that decide what a commit costs."""
    names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
             "full_page_writes", "shared_buffers", "wal_level")
    with psycopg.connect(libpq_url(PG_ADMIN), autocommit=True) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


class RedisDb:
    """A Redis database number of our own, held by the lock file the test
    suite uses, so a concurrent test session never shares it."""

    def __init__(self) -> None:
        self._lock: IO[str] | None = None
        self.url = ""

    def __enter__(self) -> RedisDb:
        # From the top down, so a benchmark and a test session rarely contend.
        taken = lock_redis_db(range(15, 0, -1))
        if taken is None:
            raise RuntimeError("every Redis database 1-15 is locked by a test session")
        self._lock, db = taken
        self.url = f"{REDIS}/{db}"
        self.flush()
        return self

    def flush(self) -> None:
        import redis

        r = redis.Redis.from_url(self.url)
        r.flushdb()
        r.close()

    def __exit__(self, *_: object) -> None:
        if self._lock is not None:
            self.flush()
            self._lock.close()


def summary(values: Iterable[float]) -> dict[str, float]:
    """Median and spread (min, max, and the count) of repeated measurements."""
    xs = sorted(values)
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}


def spread(values: Iterable[float], digits: int = 0) -> str:
    """``median (min-max)`` to ``digits`` decimals: a table cell of repeated
    measurements."""
    s = summary(values)
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def repeat_ms(fn: Callable[[], object], times: int) -> dict[str, float]:
    """Run ``fn`` ``times`` times; milliseconds per call, summarised."""
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summary(samples)


def disk_bytes(url: str, tables: Iterable[str]) -> int:
    """``pg_total_relation_size`` summed over ``tables`` (heap, TOAST, indexes)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        total = 0
        for t in tables:
            row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (t,)).fetchone()
            total += int(row[0]) if row else 0
        return total


def wal_position(conn: psycopg.Connection[Any]) -> int:
    """The server's WAL insert position, in bytes."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def row_bytes(url: str, owners: Mapping[str, str], key: str) -> dict[str, int]:
    """Stored bytes of the rows whose ``owners[table]`` column equals ``key``,
    per table (row datum as stored plus a 4-byte line pointer)."""
    out: dict[str, int] = {}
    # The system scope: row-level security hides every tenant's rows otherwise.
    with psycopg.connect(libpq_url(url), autocommit=True,
                         options="-c agent_worker.tenant=*") as conn:
        for table, column in owners.items():
            row = conn.execute(
                f"SELECT coalesce(sum(pg_column_size(t.*) + 4), 0), count(*) "
                f"FROM {table} t WHERE {column} = %s", (key,)).fetchone()
            out[table] = int(row[0]) if row else 0
            out[f"{table}_rows"] = int(row[1]) if row else 0
    return out


def total_row_bytes(per_table: Mapping[str, int]) -> int:
    return sum(v for k, v in per_table.items() if not k.endswith("_rows"))


def celery_worker(env: Mapping[str, str], concurrency: int, name: str, log: Path,
                  loglevel: str = "INFO") -> Proc:
    """``celery -A agent_worker.tasks worker`` as deployed (prefork), in its own group."""
    args = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "worker", "--loglevel",
            loglevel,
            "--concurrency", str(concurrency), "--pool", "prefork", "--without-mingle",
            "--without-gossip", "-n", f"{name}-{os.getpid()}@%h"]
    return Proc(args, dict(env), log).start()


def celery_beat(env: Mapping[str, str], log: Path) -> Proc:
    sched = log.with_suffix(".schedule")
    args = [sys.executable, "-m", "celery", "-A", "agent_worker.tasks", "beat",
            "--loglevel", "WARNING",
            "-s", str(sched)]
    return Proc(args, dict(env), log).start()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class System(Protocol):
    """One way of running the workload, for ``interleaved_runs``."""

    name: str
    url: str
    owners: Mapping[str, str]

    def run(self, rid: str, n: int) -> float:
        """Run ``rid`` (``n`` laps) to the end; its wall time in seconds."""
        ...

    def close(self) -> None: ...


def interleaved_runs(systems: list[System], sizes: Iterable[int], repeats: int, prefix: str,
                     errors: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Overhead and bytes per lap of every system at every run length.

    Systems take turns run by run (the order rotating each repeat), so a burst
    of load on this shared machine hits all of them alike and the ratios stay
    fair. Each system writes to its own database, so the disk growth measured
    over its runs is its own. A system that fails is recorded in ``errors``
    and dropped; the others go on.
    """
    from bench.workload import run_id

    live = list(systems)
    out: dict[str, dict[str, Any]] = {s.name: {} for s in systems}
    wal_conn = psycopg.connect(libpq_url(PG_ADMIN), autocommit=True)
    for n in sizes:
        before = {s.name: disk_bytes(s.url, s.owners) for s in live}
        per_lap: dict[str, list[float]] = {s.name: [] for s in live}
        wal: dict[str, list[float]] = {s.name: [] for s in live}
        rows: dict[str, list[int]] = {s.name: [] for s in live}
        tables: dict[str, dict[str, int]] = {}
        for r in range(repeats):
            turn = r % max(len(live), 1)
            for s in live[turn:] + live[:turn]:
                rid = run_id(prefix, n, r)
                try:
                    lsn = wal_position(wal_conn)
                    per_lap[s.name].append(s.run(rid, n) / n * 1e3)
                    wal[s.name].append((wal_position(wal_conn) - lsn) / n)
                except Exception as e:
                    errors[s.name] = f"run {rid}: {e!r}"
                    log(f"{s.name} FAILED on {rid}: {e!r}")
                    live.remove(s)
                    continue
                tables[s.name] = row_bytes(s.url, s.owners, rid)
                rows[s.name].append(total_row_bytes(tables[s.name]))
        for s in live:
            disk = (disk_bytes(s.url, s.owners) - before[s.name]) / repeats
            out[s.name][str(n)] = {
                "ms_per_lap": summary(per_lap[s.name]),
                # Repeat by repeat (the systems took turns), for paired ratios.
                "ms_per_lap_samples": per_lap[s.name],
                "wal_bytes_per_lap": summary(wal[s.name]),
                "row_bytes_per_run": summary(rows[s.name]),
                "row_bytes_per_lap": summary(b / n for b in rows[s.name]),
                "disk_bytes_per_run": disk, "disk_bytes_per_lap": disk / n,
                "row_bytes_by_table": tables[s.name], "run_id": run_id(prefix, n, 0),
            }
            log(f"{s.name} N={n}: {summary(per_lap[s.name])['median']:.2f} ms/lap, "
                f"{summary(rows[s.name])['median'] / n:,.0f} B/lap (rows), "
                f"{disk / n:,.0f} B/lap (disk), "
                f"{summary(wal[s.name])['min']:,.0f} B/lap (WAL, min)")
    wal_conn.close()
    return out


def settings_from(env: Mapping[str, str]) -> Settings:
    """The settings a worker started with ``env`` reads, built in this process
    without leaving ``env`` in its environment (the benchmark's own client must
    see the same configuration as its fleet)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)

