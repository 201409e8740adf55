"""One admission pass against a backlog of waiting runs, before and
after migration 0019_waiting_line, side by side in one process: *before*, the
head of each tenant's line by a window function over the whole backlog on the
schema of revision 0015; *after*, a loose index scan and a LATERAL ``LIMIT``
over ``ix_runs_admission`` rebuilt in the line's order, at the head revision.

For each backlog size: two databases on the shared Postgres (one per schema)
with the same rows: tenant ``a`` with ``N`` waiting runs and tenant ``b`` with
20 (the fairness flood), plus 10,000 finished runs (a fleet that has run
anything has them), ANALYZEd as autovacuum would. Connections are the
workers' (the app role in the system scope, row-level security on). Each
sample is one whole pass (``store.admitting.admit``: lock, slots held, the
lines, the picks, the admitting UPDATE of a fleet cap's 10 runs) in a
transaction that is then rolled back, so every sample meets the same backlog;
before and after take turns sample by sample. Also printed: each side's
statement under ``EXPLAIN (ANALYZE, BUFFERS)``: the rows it read from
``runs`` and its sorts.

    python -m bench.admission_pass                          # 2,000 and 10,000 waiting
    python -m bench.admission_pass --sizes 2000 --repeats 50
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, insert, text

from agent_worker.store import admitting
from agent_worker.store.admitting import THROTTLED, AgentShare, Policy
from agent_worker.store.db import make_engine
from agent_worker.store.migrate import upgrade
from agent_worker.store.rows import runs
from bench.common import create_database, drop_database, sa_url, summary

AGENT = "bench-pass"
POLICY = Policy(agents={AGENT: AgentShare()}, fleet=10)
Builder = Callable[..., Select[Any]]


def _fill(conn: Connection, tenant: str, n: int, status: str = "queued") -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    waiting = status == "queued"
    rows: list[dict[str, Any]] = [
        {"id": f"{tenant}-{status}-{i:06d}", "tenant": tenant, "agent_name": AGENT,
             "agent_version": "1", "status": status, "next_lap": 0 if waiting else 2,
             "input": {}, "limits": {}, "created_at": base + timedelta(milliseconds=i),
             "updated_at": base, "admitted_lap": THROTTLED if waiting else 1,
             "priority": int(i % 3 == 0)}
            for i in range(n)]
    for i in range(0, n, 1000):
        conn.execute(insert(runs), rows[i:i + 1000])


def _explain(conn: Connection, build: Builder, now: datetime) -> dict[str, Any]:
    """The statement ``build`` makes under EXPLAIN ANALYZE: rows read from
    the runs table (every scan node's actual rows times its loops), and its
    sorts."""
    stmt = build([AGENT], now, only=None, skip=[])
    sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
    if build is admitting.heads:  # as admitting._waiting plans it
        conn.execute(admitting._PLAN, {"on": "off"})
    plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)).scalar_one()
    conn.execute(admitting._PLAN, {"on": "on"})
    nodes = list(_nodes(plan[0]["Plan"]))
    read = sum(int(n["Actual Rows"]) * int(n["Actual Loops"]) for n in nodes
               if n.get("Relation Name") == "runs")
    sorts = [{"rows": int(n["Actual Rows"]), "method": n.get("Sort Method")}
             for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")]
    return {"runs_rows_read": read, "sorts": sorts,
            "scans": sorted({f'{n["Node Type"]} {n.get("Index Name", "")}'.strip()
                             for n in nodes if n.get("Relation Name") == "runs"}),
            "ms": plan[0]["Execution Time"]}


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _before(conn: Connection, agents: Any, now: datetime, *, only: Any,
            skip: Any) -> list[Any]:
    """``admitting._waiting`` as it was before 0019: the window function."""
    return list(conn.execute(admitting.ranked_heads(agents, now, only=only, skip=skip)))


def _pass_ms(engine: Any, before: bool, now: datetime) -> float:
    real = admitting._waiting
    if before:
        admitting._waiting = _before
    try:
        with engine.connect() as conn:
            t0 = time.perf_counter()
            sent = admitting.admit(conn, [], POLICY, now=now)
            ms = (time.perf_counter() - t0) * 1e3
            conn.rollback()
    finally:
        admitting._waiting = real
    assert len(sent) == 10, sent
    return ms


SIDES: dict[str, tuple[str | None, Builder]] = {
    "before (0015 index, window function)": ("0015_scale_indexes", admitting.ranked_heads),
    "after (0019 index, loose scan + LATERAL)": (None, admitting.heads),
}


def measure(size: int, repeats: int) -> dict[str, Any]:
    names = {label: f"aw_pass_{uuid.uuid4().hex[:8]}" for label in SIDES}
    engines = {}
    plans, got = {}, {}
    now = datetime.now(UTC)
    try:
        for label, (revision, build) in SIDES.items():
            url = sa_url(create_database(names[label]))
            upgrade(url, revision or "head")
            engine = engines[label] = make_engine(url)  # app role, system scope: a worker's
            with engine.begin() as conn:
                _fill(conn, "a", size)
                _fill(conn, "b", 20)
                for tenant in "abc":
                    _fill(conn, tenant, 10_000 // 3, status="succeeded")
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE runs"))
            with engine.connect() as conn:
                plans[label] = _explain(conn, build, now)
                got[label] = [r.id for r in conn.execute(
                    build([AGENT], now, only=None, skip=[]))]
                assert len(got[label]) == admitting.PER_TENANT + 20, len(got[label])
        times: dict[str, list[float]] = {label: [] for label in SIDES}
        for _ in range(repeats):
            for label, (revision, _) in SIDES.items():
                times[label].append(_pass_ms(engines[label], revision is not None, now))
    finally:
        for engine in engines.values():
            engine.dispose()
        for name in names.values():
            drop_database(name)
    return {"waiting": size + 20, "same_heads": len({tuple(ids) for ids in got.values()}) == 1,
            "pass_ms": {label: {k: round(v, 2) for k, v in summary(t).items()}
                        for label, t in times.items()},
            "explain": plans}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2000,10000")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    for size in (int(s) for s in args.sizes.split(",")):
        load = [round(x, 2) for x in os.getloadavg()]
        result = measure(size, args.repeats)
        print(json.dumps({"load_before": load, **result,
                          "load_after": [round(x, 2) for x in os.getloadavg()]},
                         indent=2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
