"""Listing a tenant's runs by label and by status at a million runs, under
forced row-level security, before and after migration ``0016_run_labels``
(the goal: "under 50 ms").

    python -m bench.listings --before aw_scale_0015 --after aw_scale --repeat 15

Two copies of ``bench.seed``'s database: ``--before`` left at
``0015_scale_indexes`` and asked the statement ``store.listing`` sent then
(``labels @> '{"k": "v"}'`` on the run row), ``--after`` upgraded to
``0016_run_labels`` and asked the store's statement of now (a walk of
``run_labels``). The probes take turns between the two databases, probe by
probe, so the machine's load falls on both alike. Each probe is timed inside
Postgres (``EXPLAIN ANALYZE``'s execution time of the very statement) and end
to end (the statement through SQLAlchemy into ``RunRecord``s), medians; one
line of JSON per probe and database, with the plan's node types.

Scopes: ``system`` is how the store's processes connect
(``agent_worker.tenant=*``, the policy still applied: the app role is the
tables' owner under ``FORCE``); ``tenant`` narrows the transaction to the
tenant as ``AgentWorker``'s verbs do for a principal (``store.tenancy``).
Probes that name no tenant run in the system scope only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any, cast

from sqlalchemy import Connection, Engine, Select, bindparam, select, text, tuple_
from sqlalchemy.dialects.postgresql import JSONB

from agent_worker.core.vocabulary import RunStatus
from agent_worker.store.db import make_engine
from agent_worker.store.listing import RunFilter, _query, encode_cursor
from agent_worker.store.rows import runs, to_run
from agent_worker.store.sql import SqlStore
from bench.labels import _driver
from bench.plans import statements

BASE_URL = "postgresql+psycopg://agent_worker@127.0.0.1:54329/"
TENANT = "tenant-40"  # bench.scale's tenant: holds queue=vip runs
SLOW_MS = 500.0  # a probe this slow is sampled 3 times, not --repeat


def legacy_query(f: RunFilter, after: tuple[Any, str] | None, limit: int) -> Select[Any]:
    """The statement ``store.listing`` sent before ``0016_run_labels``
    (``labels @> :labels`` on the run row; the rest as now)."""
    q = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
    if f.labels:
        q = q.where(runs.c.labels.op("@>")(bindparam("labels", dict(f.labels), type_=JSONB)))
    for column, wanted in ((runs.c.status, f.status), (runs.c.tenant, f.tenant)):
        if wanted is not None:
            q = q.where(column == wanted)
    if after is not None:
        q = q.where(tuple_(runs.c.created_at, runs.c.id) < tuple_(
            bindparam("after_at", after[0], type_=runs.c.created_at.type),
            bindparam("after_id", after[1])))
    return q


def _list_runs_sql(engine: Engine, status: RunStatus) -> tuple[str, dict[str, Any]]:
    """The statement ``Store.list_runs(tenant=, status=)`` sends (unchanged by 0016)."""
    store = SqlStore(engine)
    ((sql, params),) = statements(engine, lambda: store.list_runs(
        tenant=TENANT, status=status, limit=100))
    return sql, dict(params)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _plan_line(plan: dict[str, Any]) -> str:
    return " > ".join(f'{n["Node Type"]}' + (f' {n["Index Name"]}' if "Index Name" in n
                                              else "") for n in _nodes(plan["Plan"]))


def _time(c: Connection, sql: str, params: dict[str, Any], repeat: int) -> dict[str, Any]:
    (first,) = c.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).scalar_one()
    n = 3 if first["Execution Time"] > SLOW_MS else repeat
    db, e2e, rows = [], [], 0
    for _ in range(n):
        (plan,) = c.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql,
                                    params).scalar_one()
        db.append(float(plan["Execution Time"]))
        t = time.perf_counter()
        rows = len([to_run(r) for r in c.exec_driver_sql(sql, params)])
        e2e.append((time.perf_counter() - t) * 1e3)
    return {"db_ms": round(statistics.median(db), 2), "e2e_ms": round(statistics.median(e2e), 1),
            "rows": rows, "samples": n, "plan": _plan_line(first)}


def _statement(c: Connection, f: RunFilter, page: int, legacy: bool) -> tuple[str, dict[str, Any]]:
    after = None
    for _ in range(page - 1):  # the cursor a client would hold: the last row of the page before
        q = (legacy_query(f, after, 100) if legacy else _query(c, f, after, 100))
        last = to_run(c.execute(q).all()[-1])
        after = (last.created_at, last.id)
        assert encode_cursor(last)  # what search_runs would hand out
    q = legacy_query(f, after, 101) if legacy else _query(c, f, after, 101)
    compiled = q.compile(dialect=c.dialect)
    return compiled.string, {k: _driver(v) for k, v in compiled.params.items()}


def probes() -> list[tuple[str, RunFilter, int, bool]]:
    """(name, filter, page, tenant-scoped too?)."""
    three = {"customer": "acme-42", "queue": "std", "region": "eu-0"}
    return [
        ("label customer=acme-42, any tenant", RunFilter(labels={"customer": "acme-42"}), 1,
         False),
        ("label queue=vip, any tenant", RunFilter(labels={"queue": "vip"}), 1, False),
        ("label queue=vip page 2, any tenant", RunFilter(labels={"queue": "vip"}), 2, False),
        ("three labels, any tenant", RunFilter(labels=three), 1, False),
        ("no match, any tenant", RunFilter(labels={"customer": "nobody"}), 1, False),
        ("label customer=acme-40", RunFilter(tenant=TENANT, labels={"customer": "acme-40"}), 1,
         True),
        ("label queue=vip", RunFilter(tenant=TENANT, labels={"queue": "vip"}), 1, True),
        ("label queue=vip page 2", RunFilter(tenant=TENANT, labels={"queue": "vip"}), 2, True),
        ("three labels", RunFilter(tenant=TENANT, labels={
            "customer": "acme-40", "queue": "std", "region": "eu-5"}), 1, True),
        ("no match", RunFilter(tenant=TENANT, labels={"customer": "nobody"}), 1, True),
        ("search status=succeeded", RunFilter(tenant=TENANT, status="succeeded"), 1, True),
        ("search status=waiting", RunFilter(tenant=TENANT, status="waiting"), 1, True),
    ]


def _stamp() -> None:
    print(json.dumps({"load": [round(x, 1) for x in os.getloadavg()],
                      "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a copy of bench.seed's db at 0015")
    ap.add_argument("--after", required=True, help="a copy upgraded to 0016_run_labels")
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    engines = {"before": make_engine(BASE_URL + a.before),
               "after": make_engine(BASE_URL + a.after)}
    _stamp()
    work: list[tuple[str, str, Any]] = []
    for name, f, page, scoped in probes():
        work += [(name, scope, (f, page)) for scope in (("system", "tenant") if scoped
                                                        else ("system",))]
    statuses: tuple[RunStatus, ...] = ("succeeded", "waiting")
    work += [(f"list_runs status={s}", scope, s) for s in statuses
             for scope in ("system", "tenant")]
    for name, scope, what in work:
        for which, engine in engines.items():
            with engine.connect() as c:
                if scope == "tenant":
                    c.execute(text("SELECT set_config('agent_worker.tenant', :t, true)"),
                              {"t": TENANT})
                if isinstance(what, str):
                    sql, params = _list_runs_sql(engine, cast(RunStatus, what))
                else:
                    sql, params = _statement(c, what[0], what[1], legacy=which == "before")
                print(json.dumps({"probe": name, "scope": scope, "db": which,
                                  **_time(c, sql, params, a.repeat)}), flush=True)
                c.rollback()
    _stamp()
    for engine in engines.values():
        engine.dispose()


if __name__ == "__main__":
    main()
