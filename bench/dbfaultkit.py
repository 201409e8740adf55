"""Database-side faults under a steady lap load, shared by the chaos suite
(``tests/chaos/test_database_faults.py``, short) and ``python -m bench.dbfaults``
(the full durations): the faults Postgres job queues are benchmarked on.

* ``Terminations``: every client backend of the fleet's database is terminated
  every few seconds, the workers' and the sweeper's included, as a failover
  proxy or an operator's ``pg_terminate_backend`` does.
* ``HeldHorizon``: one session sits idle in an open transaction, so no dead row
  version of any table of the database can be removed while it stays open.

``Feeder`` keeps a fixed number of ``chaos-mix`` runs going (``tests.agents``:
odd laps read and sleep, even laps pay at the demo vendor under the effect's
idempotency key), so the lap rate is steady; ``drive`` measures it before,
during and after a fault, and ``verify`` checks every lap and effect after.

Every query here runs on a new connection, retried: a monitor that shares the
fleet's database is terminated like every other client of it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from bench.common import libpq_url

AGENT = "chaos-mix"
#: The tables whose bloat a held horizon shows: each lap updates its run row
#: and writes its effect row twice (intent, then outcome).
BLOAT_TABLES = ("runs", "effects")
#: Seconds between two progress readings.
TICK = 0.5
#: How long the runs begun may take to finish once no new one starts.
DRAIN_SECONDS = 120.0
#: How long the workers may take to start (they commit no lap before).
WARM_UP_SECONDS = 60.0


@contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection in the system scope (row-level security would
    hide every tenant's rows from the app role), retried while the fault
    terminates connections as they open."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=5,
                                   options="-c agent_worker.tenant=*")
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        yield conn
    finally:
        conn.close()


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``sql``'s rows, on a new connection, retried for 30 s of terminations."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with connect(url) as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Fault(Protocol):
    """One fault: ``begin``, ``tick`` every ``TICK`` while it lasts, ``end``
    returning its figures."""

    name: str

    def begin(self) -> None: ...

    def tick(self) -> None: ...

    def end(self) -> dict[str, Any]: ...


@dataclass
class Terminations:
    """Terminate every client backend of the database every ``every`` seconds
    (but the terminating session's own)."""

    url: str
    every: float = 5.0
    name: str = "terminations"
    terminated: int = 0
    rounds: int = 0
    _next: float = 0.0

    def begin(self) -> None:
        self._next = time.monotonic()
        self.tick()

    def tick(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next += self.every
        rows = query(self.url, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                     "FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        self.terminated += int(rows[0][0])
        self.rounds += 1

    def end(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "backends_terminated": self.terminated}


def bloat(url: str) -> dict[str, dict[str, int]]:
    """Per table of ``BLOAT_TABLES``: its total size (heap, TOAST, indexes) in
    bytes, and its live and dead row versions as the statistics count them."""
    rows = query(url, "SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup "
                 "FROM pg_stat_user_tables WHERE relname = ANY(%s)", (list(BLOAT_TABLES),))
    return {r[0]: {"bytes": int(r[1]), "live": int(r[2]), "dead": int(r[3])} for r in rows}


@dataclass
class HeldHorizon:
    """A session idle in a transaction that holds an xid (``txid_current()``):
    every snapshot taken after it counts it as running, so vacuum and page
    pruning keep every row version that died since. ``end`` reads the bloat,
    rolls the session back, and runs what an operator runs next (``VACUUM``)."""

    url: str
    name: str = "held_horizon"
    figures: dict[str, Any] = field(default_factory=dict)
    _conn: psycopg.Connection[Any] | None = None

    def begin(self) -> None:
        self.figures["before"] = bloat(self.url)
        self._conn = psycopg.connect(libpq_url(self.url), options="-c agent_worker.tenant=*")
        self._conn.execute("SELECT txid_current()")  # an xid: the horizon stops here

    def tick(self) -> None:
        pass

    def end(self) -> dict[str, Any]:
        assert self._conn is not None
        held = query(self.url, "SELECT state, extract(epoch FROM clock_timestamp() - xact_start) "
                     "FROM pg_stat_activity WHERE pid = %s", (self._conn.info.backend_pid,))
        # No row: something ended the session (idle_in_transaction_session_timeout).
        state, seconds = held[0] if held else ("gone", 0.0)
        self.figures["held"] = {"state": state, "seconds": round(float(seconds), 1)}
        self.figures["at_release"] = bloat(self.url)
        self._conn.rollback()
        self._conn.close()
        t0 = time.monotonic()
        with connect(self.url) as conn:
            for table in BLOAT_TABLES:
                conn.execute(f"VACUUM {table}")
        self.figures["vacuum_seconds"] = round(time.monotonic() - t0, 2)
        self.figures["after_vacuum"] = bloat(self.url)
        return self.figures


@dataclass
class Feeder:
    """Keeps ``active`` runs of ``laps`` laps going: a new one starts as one
    finishes, so the fleet always has work and the lap rate is steady."""

    start_run: Callable[..., Any]
    prefix: str
    active: int
    laps: int = 10
    pause: float = 0.5
    started: int = 0
    feeding: bool = True

    def top_up(self, unfinished: int) -> None:
        while self.feeding and unfinished < self.active:
            tag = f"{self.prefix}{self.started}"
            self.started += 1
            # The store retries a terminated connection; a retried call with
            # the same run id returns the run a lost answer had created.
            self.start_run(AGENT, {"tag": tag, "laps": self.laps, "amount": 100,
                                   "pause": self.pause}, run_id=tag)
            unfinished += 1


def progress(url: str, prefix: str) -> tuple[int, int]:
    """(laps committed, runs not finished) of the runs whose id starts with ``prefix``."""
    row = query(url, "SELECT coalesce(sum(next_lap - 1), 0), count(*) FILTER (WHERE status "
                "NOT IN ('succeeded', 'failed', 'cancelled')) FROM runs WHERE id LIKE %s",
                (prefix + "%",))[0]
    return int(row[0]), int(row[1])


@dataclass
class Meter:
    """(seconds since the start, laps committed) every ``TICK``."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def rate(self, t0: float, t1: float) -> float:
        """Laps a second between the first samples at or after ``t0`` and ``t1``."""
        a = next((s for s in self.samples if s[0] >= t0), None)
        b = next((s for s in self.samples if s[0] >= t1), self.samples[-1])
        if a is None or b[0] <= a[0]:
            return 0.0
        return (b[1] - a[1]) / (b[0] - a[0])

    def recovered_after(self, t: float, baseline: float, window: float,
                        fraction: float) -> float | None:
        """Seconds after ``t`` until the first ``window`` whose rate is at least
        ``fraction`` of ``baseline``, or ``None`` if none has yet."""
        for start, _ in self.samples:
            if start < t:
                continue
            if self.samples[-1][0] < start + window:
                return None
            if self.rate(start, start + window) >= fraction * baseline:
                return start - t
        return None


@dataclass(frozen=True)
class Plan:
    """Seconds of each phase; the post-fault phase ends once the rate is back
    (a ``window`` at ``fraction`` of the baseline) or after ``recover_within``."""

    baseline: float
    fault: float
    recover_within: float = 60.0
    window: float = 10.0
    fraction: float = 0.75


def drive(url: str, feeder: Feeder, fault: Fault | None, plan: Plan,
          log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Baseline, fault, recovery, then drain (no new runs; every run ends).
    Returns the figures; ``recovered_s`` is ``None`` if the rate did not come
    back within ``plan.recover_within``. Without a fault: the baseline only."""
    meter = Meter()
    warm = time.monotonic() + WARM_UP_SECONDS
    while time.monotonic() < warm:  # the workers are up once every run has begun
        committed, unfinished = progress(url, feeder.prefix)
        feeder.top_up(unfinished)
        if committed >= feeder.active:
            break
        time.sleep(TICK)
    t0 = time.monotonic()

    def tick() -> float:
        now = time.monotonic() - t0
        committed, unfinished = progress(url, feeder.prefix)
        meter.samples.append((now, committed))
        feeder.top_up(unfinished)
        if fault is not None and plan.baseline <= now < plan.baseline + plan.fault:
            fault.tick()
        time.sleep(TICK)
        return now

    while (now := tick()) < plan.baseline:
        pass
    baseline = meter.rate(0.0, plan.baseline)
    fault_figures: dict[str, Any] = {}
    fault_end = plan.baseline + plan.fault
    recovered = None
    if fault is not None:
        log(f"{fault.name} begins")
        fault.begin()
        while tick() < fault_end:
            pass
        fault_figures = fault.end()
        log(f"{fault.name} ends: {json.dumps(fault_figures)}")
        while (now := tick()) < fault_end + plan.recover_within + plan.window:
            recovered = meter.recovered_after(fault_end, baseline, plan.window, plan.fraction)
            if recovered is not None:
                break
    feeder.feeding = False
    deadline = time.monotonic() + DRAIN_SECONDS
    while progress(url, feeder.prefix)[1] and time.monotonic() < deadline:
        time.sleep(TICK)
    figures: dict[str, Any] = {"baseline_laps_per_s": round(baseline, 2),
                               "elapsed_s": round(now, 1), "runs": feeder.started}
    if fault is not None:
        figures.update({
            "fault_laps_per_s": round(meter.rate(plan.baseline, fault_end), 2),
            "first_window_after_laps_per_s": round(
                meter.rate(fault_end, fault_end + plan.window), 2),
            "recovered_s": None if recovered is None else round(recovered, 1),
            "fault": fault_figures})
    return figures


def lost_leases(url: str, prefix: str) -> dict[str, int]:
    """Laps taken over after their lease expired, and lap attempts retried."""
    row = query(url, "SELECT (SELECT coalesce(sum(recoveries), 0) FROM runs WHERE id LIKE %s), "
                "(SELECT count(*) FROM events WHERE kind = 'retry' AND run_id LIKE %s)",
                (prefix + "%", prefix + "%"))[0]
    return {"recoveries": int(row[0]), "retries": int(row[1])}


class Stoppable(Protocol):
    def stop(self) -> None: ...


def pool_phases(url: str, start_run: Callable[..., Any], worker: Callable[[str], Stoppable], *,
                concurrency: int, seconds: float, pause: float,
                log: Callable[[str], None] = lambda _m: None) -> dict[str, dict[str, Any]]:
    """The same slow-tool load on a worker whose pool keeps 20 connections,
    then on one that keeps 1 (``worker(pool_size)`` starts it): the lap rate
    and the leases lost of each. Each phase drains before its worker stops,
    so stopping it hands back no lap."""
    out: dict[str, dict[str, Any]] = {}
    for pool in ("20", "1"):
        prefix = f"dbf-pool{pool}-"
        proc = worker(pool)
        feeder = Feeder(start_run, prefix, concurrency + 4, laps=4, pause=pause)
        figures = drive(url, feeder, None, Plan(baseline=seconds, fault=0.0), log)
        proc.stop()
        out[pool] = {**figures, **lost_leases(url, prefix), "prefix": prefix}
        log(f"pool {pool}: {json.dumps(out[pool])}")
    return out


def vendor_applied(db_path: Path) -> list[tuple[str, str]]:
    """(idempotency key, order id) of every effect the vendor really applied."""
    with sqlite3.connect(db_path) as v:
        rows = v.execute("SELECT idem_key, request FROM effects WHERE applied = 1").fetchall()
    return [(k, json.loads(req)["order_id"]) for k, req in rows]


def verify(url: str, prefix: str, vendor_db: Path) -> list[str]:
    """What went wrong, against DESIGN.md's invariants (empty: nothing): every
    run succeeded with no lease left, each lap committed once with checkpoints
    0..N, and the vendor applied each payment of every run exactly once, as the
    ledger says."""
    like = (prefix + "%",)
    runs = {r[0]: (r[1], r[2], int(r[3])) for r in query(
        url, "SELECT id, status, lease_owner, input->>'laps' FROM runs WHERE id LIKE %s", like)}
    problems = [f"run {rid}: {status}, lease {owner}" for rid, (status, owner, _n)
                in runs.items() if status != "succeeded" or owner]
    if not runs:
        problems.append(f"no run {prefix}* in the database")
    commits = query(url, "SELECT run_id, lap, count(*) FROM events WHERE kind = 'lap_committed' "
                    "AND run_id LIKE %s GROUP BY run_id, lap", like)
    problems += [f"lap {lap} of {rid} committed {n} times" for rid, lap, n in commits if n != 1]
    want_laps = sum(n + 1 for *_rest, n in runs.values())
    if len(commits) != want_laps:
        problems.append(f"{len(commits)} laps committed, {want_laps} expected")
    for rid, laps in query(url, "SELECT run_id, array_agg(lap ORDER BY lap) FROM checkpoints "
                           "WHERE run_id LIKE %s GROUP BY run_id", like):
        if list(laps) != list(range(runs[rid][2] + 2)):
            problems.append(f"checkpoints of {rid}: {laps}")
    ledger = dict(query(url, "SELECT key, status FROM effects WHERE run_id LIKE %s", like))
    problems += [f"effect {k} is {s}" for k, s in ledger.items() if s != "applied"]
    applied = [(k, o) for k, o in vendor_applied(vendor_db) if o.startswith(prefix)]
    keys = [k for k, _ in applied]
    orders = [o for _, o in applied]
    expected = {f"{rid}-{lap}" for rid, (*_rest, n) in runs.items() for lap in range(2, n + 1, 2)}
    if len(set(keys)) != len(keys) or len(set(orders)) != len(orders):
        problems.append(f"duplicates at the vendor: {len(keys) - len(set(orders))}")
    if set(orders) != expected:
        problems.append(f"vendor orders: {len(expected - set(orders))} lost, "
                        f"{len(set(orders) - expected)} unexpected")
    if set(keys) != set(ledger):
        problems.append(f"ledger and vendor differ: {len(set(ledger) ^ set(keys))} keys")
    return problems


__all__ = ["AGENT", "Feeder", "HeldHorizon", "Meter", "Plan", "Terminations", "bloat",
           "drive", "lost_leases", "pool_phases", "progress", "query", "vendor_applied",
           "verify"]
