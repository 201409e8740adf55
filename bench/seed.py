"""A database holding a million runs, seeded by bulk COPY.

    python -m bench.seed --finished 1000000 --paused 100000 --active 10000 --db aw_scale

Creates (or replaces) database ``--db``, brings it to the schema head, then
streams every table's rows through psycopg's ``cursor.copy`` in one
transaction: a million ``start_run`` calls would take hours and measure the
API, not the size. What a run leaves behind, by kind:

* **finished** (succeeded 90 %, failed 8 %, cancelled 2 %): the run row with its
  totals, result or error and ``finished_at``; its final checkpoint (retention
  has pruned the others); two messages of about 300 bytes; three events
  (``run_created`` and two ``lap_committed`` with a lap trace); an applied
  effect on every fourth run.
* **paused**: half ``waiting`` on a pending approval (an approval row timing
  out in a week), half ``sleeping`` until a time one hour to thirty days ahead.
* **active**: half ``queued`` with a hand-off sent, half ``running`` under a
  live lease; both expire a day after seeding (``bench.scale`` renews them), so
  the sweeper finds nothing due and a pass measures only its finding.

Every run has a tenant (100 of them, evenly), an agent (5), and the labels of
``bench.labels`` (``customer``: 10,000 values; ``queue``: ``vip`` on 10 %;
``region``: 7 values), so that benchmark's cases apply here unchanged. Runs
are numbered in creation order: finished ones over the past year, paused ones
over the past month, active ones over the past hour.

Row-level security (``FORCE``, migration ``0003_tenancy``) refuses ``COPY
FROM`` for the owning role, so the transaction lifts ``FORCE`` from the tables
it fills and puts it back before it commits: nobody ever sees them without it.
The same transaction disables the triggers that would fire once per copied
row (the events' ordering, the label rows, the metrics rollups' deltas) and
enables them again before it commits, having written what they would have
(``run_labels`` by COPY, ``run_totals`` and ``approval_totals`` from
``bench.seedtotals``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from agent_worker.core.vocabulary import WaitingFor
from agent_worker.store.migrate import upgrade
from bench.common import create_database, libpq_url, log, sa_url
from bench.seedtotals import SEEDED, Totals

TENANTS, AGENTS, CUSTOMERS, REGIONS = 100, 5, 10_000, 7
FILLED = ("runs", "run_labels", "checkpoints", "messages", "events", "effects", "approvals")
EVENTS_TRIGGER = "events_order_notify"
LABELS_TRIGGER = "run_labels_from_run"  # migration 0016: the seed copies run_labels itself
TEXT = "lorem ipsum dolor sit amet consectetur " * 8  # ~300 bytes of prose
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Shape:
    """How many runs of each kind; run ``g`` is finished below ``finished``,
    then paused, then active."""

    finished: int
    paused: int
    active: int

    @property
    def total(self) -> int:
        return self.finished + self.paused + self.active

    def kind(self, g: int) -> str:
        if g < self.finished:
            return "finished"
        return "paused" if g < self.finished + self.paused else "active"


def run_id(g: int) -> str:
    return f"seed-{g:07d}"


def turn(g: int) -> int:
    """What picks run ``g``'s status and queue: it steps by one from each of a
    tenant's runs to its next, so every tenant holds every status (``g % 2``
    would give the even tenants no waiting run at all), and from each run to
    the next, so a tiny seed holds every status too."""
    return g // TENANTS + g % TENANTS


def label_map(g: int) -> dict[str, str]:
    return {"customer": f"acme-{g % CUSTOMERS}", "queue": "vip" if turn(g) % 10 == 0 else "std",
            "region": f"eu-{g % REGIONS}"}


def labels(g: int) -> str:
    return json.dumps(label_map(g))


class Seeder:
    """Rows of every table, generated from the run number alone (no randomness:
    two seeds of one shape hold the same rows, apart from the clock)."""

    def __init__(self, shape: Shape, now: datetime) -> None:
        self.shape, self.now = shape, now

    def created(self, g: int) -> datetime:
        s, kind = self.shape, self.shape.kind(g)
        if kind == "finished":
            return self.now - timedelta(days=365) + timedelta(days=365) * g / max(s.finished, 1)
        if kind == "paused":
            i = g - s.finished
            return self.now - timedelta(days=30) + timedelta(days=29) * i / max(s.paused, 1)
        i = g - s.finished - s.paused
        return self.now - timedelta(hours=1) + timedelta(minutes=59) * i / max(s.active, 1)

    def waits(self, g: int) -> bool:
        """Whether paused run ``g`` waits on an approval (else it sleeps)."""
        return self.shape.kind(g) == "paused" and turn(g) % 2 == 1

    def laps(self, g: int) -> int:
        return 1 + g % 8

    def run(self, g: int) -> Row:
        kind, at, laps = self.shape.kind(g), self.created(g), self.laps(g)
        status, lease_owner, lease_exp, wake_at, enqueued_at, waiting_for = (
            "succeeded", None, None, None, None, None)
        result: str | None = None
        error: tuple[str | None, str | None] = (None, None)
        finished_at: datetime | None = None
        later = self.now + timedelta(days=1)
        if kind == "finished":
            r = turn(g) % 50
            status = ("succeeded", "failed", "cancelled")[(r >= 45) + (r == 49)]
            finished_at = at + timedelta(seconds=30 * laps)
            if status == "succeeded":
                result = json.dumps({"answer": TEXT[:120]})
            else:
                error = (("tool_failed", "the refund API answered 500") if status == "failed"
                         else ("cancelled", "cancelled by an operator"))
        elif kind == "paused":
            if self.waits(g):
                status, waiting_for = "waiting", WaitingFor.approval(f"ap-{g}").format()
            else:
                status = "sleeping"
                wake_at = self.now + timedelta(hours=1) + timedelta(minutes=g % (30 * 24 * 60))
        elif turn(g) % 2:
            status, lease_owner, lease_exp = "running", "seed-worker", later
        else:
            status, lease_exp, enqueued_at = "queued", later, self.now
        updated = finished_at or at + timedelta(seconds=30 * laps)
        return (run_id(g), f"tenant-{g % TENANTS}", f"agent-{g // 7 % AGENTS}", "1", status,
                laps + 1, 0, lease_owner, lease_exp, wake_at, enqueued_at, waiting_for,
                json.dumps({"task": "answer the customer's ticket"}), result, error[0],
                error[1], '{"max_laps": 50}', laps, 900 * laps, 300 * laps, 4200 * laps,
                "full", 0, at, updated, updated, finished_at, labels(g), 0)

    RUN_COLUMNS = ("id, tenant, agent_name, agent_version, status, next_lap, lap_attempts, "
                   "lease_owner, lease_expires_at, wake_at, enqueued_at, waiting_for, input, "
                   "result, error_code, error_message, limits, laps_used, input_tokens, "
                   "output_tokens, cost_micros, retention, recoveries, created_at, updated_at, "
                   "last_checkpoint_at, finished_at, labels, priority")

    def label_rows(self, g: int) -> Iterator[Row]:
        """The run's labels as ``run_labels`` rows (migration 0016), as
        the trigger on ``runs`` writes them (disabled for the load: one COPY
        beats a trigger call per run)."""
        for key, value in label_map(g).items():
            yield (run_id(g), key, value, f"tenant-{g % TENANTS}", self.created(g))

    def checkpoint(self, g: int) -> Iterator[Row]:
        laps = self.laps(g)
        state = {"schema_version": 1, "messages": 2 * laps, "facts": {"customer": g % CUSTOMERS},
                 "plan": [{"item": "answer", "status": "done"}],
                 "budget": {"laps": laps, "input_tokens": 900 * laps}}
        yield (run_id(g), laps, 1, json.dumps(state), self.created(g))

    def messages(self, g: int) -> Iterator[Row]:
        at, laps = self.created(g), self.laps(g)
        yield (run_id(g), 0, 0, json.dumps({"role": "user", "content": TEXT}), at)
        yield (run_id(g), 1, laps, json.dumps({"role": "assistant", "content": TEXT}), at)

    def events(self, g: int) -> Iterator[Row]:
        at, laps = self.created(g), self.laps(g)
        yield (run_id(g), 0, "run_created", None, at)
        for lap in (1, laps):
            trace = [{"step": "claim", "ms": 1.4}, {"step": "commit", "ms": 3.1 + g % 7}]
            yield (run_id(g), lap, "lap_committed", json.dumps({"trace": trace}), at)

    def effects(self, g: int) -> Iterator[Row]:
        if g % 4 == 0 and self.shape.kind(g) == "finished":
            at = self.created(g)
            yield (f"{run_id(g)}:1:0", run_id(g), 1, 0, "refund", "1", "idempotent",
                   f"{g:064x}", json.dumps({"amount": g % 500}), "applied",
                   json.dumps({"refund_id": f"re_{g}"}), None, 1, at, at)

    def approvals(self, g: int) -> Iterator[Row]:
        if self.waits(g):
            at = self.created(g)
            yield (f"ap-{g}", run_id(g), f"{run_id(g)}:{self.laps(g)}:0", "refund",
                   json.dumps({"amount": g % 500}), "pending", "reject", at,
                   self.now + timedelta(days=7))


TABLES: dict[str, tuple[str, Callable[[Seeder, int], Iterator[Row]]]] = {
    "runs": (Seeder.RUN_COLUMNS, lambda s, g: iter((s.run(g),))),
    "run_labels": ("run_id, key, value, tenant, created_at", Seeder.label_rows),
    "checkpoints": ("run_id, lap, schema_version, state, created_at", Seeder.checkpoint),
    "messages": ("run_id, seq, lap, body, created_at", Seeder.messages),
    "events": ("run_id, lap, kind, data, created_at", Seeder.events),
    "effects": ("key, run_id, lap, call_index, tool_name, tool_version, kind, args_hash, args, "
                "status, result, error, attempts, created_at, updated_at", Seeder.effects),
    "approvals": ("id, run_id, effect_key, tool_name, arguments, status, on_timeout, "
                  "requested_at, timeout_at", Seeder.approvals),
}


def _secondary_indexes(conn: psycopg.Connection[Any], tables: Sequence[str]
                       ) -> list[tuple[str, str]]:
    """Name and definition of every index on ``tables`` that backs no
    constraint: dropped before the load and rebuilt after it from the very
    definitions the migrations made (one sort per index beats a million
    insertions into it)."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "WHERE i.indrelid = ANY(%s::regclass[]) AND NOT EXISTS "
        "(SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)", (list(tables),))]


def seed(url: str, shape: Shape, *, tables: Sequence[str] = FILLED) -> dict[str, int]:
    """COPY every row of ``shape`` into the (migrated, empty) database at
    ``url`` in one transaction, then VACUUM ANALYZE; rows written per table."""
    seeder = Seeder(shape, datetime.now(UTC).replace(tzinfo=None))
    counts: dict[str, int] = {}
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for table in tables:
            conn.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        # Its row lock and NOTIFY per event order the events of a live run
        # (migration 0006); nothing reads this database yet, and the ids drawn
        # in run order are already in commit order.
        conn.execute(f"ALTER TABLE events DISABLE TRIGGER {EVENTS_TRIGGER}")
        conn.execute(f"ALTER TABLE runs DISABLE TRIGGER {LABELS_TRIGGER}")
        totals = {s.table: Totals(s, TABLES[s.table][0]) for s in SEEDED if s.table in tables}
        for t in totals.values():
            conn.execute(f"ALTER TABLE {t.seeded.table} DISABLE TRIGGER {t.seeded.trigger}")
        indexes = _secondary_indexes(conn, tables)
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        with conn.cursor() as cur:
            for table in tables:
                columns, rows = TABLES[table]
                t0, n = time.perf_counter(), 0
                rollup = totals.get(table)
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for g in range(shape.total):
                        for row in rows(seeder, g):
                            copy.write_row(row)
                            n += 1
                            if rollup is not None:
                                rollup.add(row)
                counts[table] = n
                log(f"{table}: {n:,} rows in {time.perf_counter() - t0:.1f} s")
            for t in totals.values():
                counts[t.seeded.rollup.totals.name] = t.write(cur)
        t0 = time.perf_counter()
        for _, definition in indexes:
            conn.execute(definition)
        log(f"{len(indexes)} indexes rebuilt in {time.perf_counter() - t0:.1f} s")
        conn.execute(f"ALTER TABLE events ENABLE TRIGGER {EVENTS_TRIGGER}")
        conn.execute(f"ALTER TABLE runs ENABLE TRIGGER {LABELS_TRIGGER}")
        for t in totals.values():
            conn.execute(f"ALTER TABLE {t.seeded.table} ENABLE TRIGGER {t.seeded.trigger}")
        for table in tables:
            conn.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in tables:
            conn.execute(f"VACUUM ANALYZE {table}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--paused", type=int, default=100_000)
    ap.add_argument("--active", type=int, default=10_000)
    ap.add_argument("--db", default="aw_scale", help="database to (re)create")
    a = ap.parse_args()
    t0 = time.perf_counter()
    url = create_database(a.db)
    upgrade(sa_url(url))
    counts = seed(url, Shape(a.finished, a.paused, a.active))
    print(json.dumps({"db": a.db, "rows": counts,
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
