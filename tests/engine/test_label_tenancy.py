"""Label search and status listings under forced row-level security, on
Postgres (migration ``0016_run_labels``): a tenant never finds another's runs,
not even by the other's label values; ``run_labels`` is invisible across
tenants at the SQL level; the search is an index walk in listing order (which
``jsonb @>`` never was under the policy); and the policy's system arm no
longer makes the planner believe a tenant's listing matches almost nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from agent_worker import InProcessWorker
from agent_worker.agent import Registry
from agent_worker.core.principal import Principal
from agent_worker.store import tenancy
from agent_worker.store.listing import RunFilter, _query, search_runs
from agent_worker.store.sql import SqlStore
from tests.engine.test_label_rows import tagged

TAG = uuid.uuid4().hex[:8]
A, B = f"lab-a-{TAG}", f"lab-b-{TAG}"


@pytest.fixture(scope="module")
def w(database_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(database_url, retry_backoff_seconds=0)
    worker.rt.registry = Registry()
    yield tagged(worker)
    assert isinstance(worker.rt.store, SqlStore)
    worker.rt.store.dispose()


@pytest.fixture(scope="module")
def runs_ab(w: InProcessWorker) -> dict[str, str]:
    """One run per tenant, both labelled ``batch=TAG``; B's also with a
    customer of its own; A's run finishes, B's stays queued."""
    a = w.start_run("tagged", "go", tenant=A, labels={"batch": TAG, "customer": "a-1"})
    w.run_until_idle()
    b = w.start_run("tagged", "go", tenant=B, labels={"batch": TAG, "customer": f"b-{TAG}"})
    return {"a": a.id, "b": b.id}


def _as(w: InProcessWorker, tenant: str) -> InProcessWorker:
    return w.acting_as(Principal(f"{tenant}:ann", tenant, frozenset({"operator"})))


def test_a_tenant_never_finds_another_tenants_runs(
        w: InProcessWorker, runs_ab: dict[str, str]) -> None:
    a = _as(w, A)
    assert [r.id for r in a.search_runs(labels={"batch": TAG}).runs] == [runs_ab["a"]]
    for probe in ({"customer": f"b-{TAG}"}, {"batch": TAG, "customer": f"b-{TAG}"}):
        assert a.search_runs(labels=probe).runs == []
        assert a.search_runs(labels=probe, tenant=B).runs == []
    assert runs_ab["b"] not in {r.id for r in a.search_runs(status="queued", limit=1000).runs}
    assert runs_ab["b"] not in {r.id for r in a.list_runs(status="queued", limit=1000)}
    assert [r.id for r in _as(w, B).search_runs(labels={"customer": f"b-{TAG}"}).runs] \
        == [runs_ab["b"]]
    # Below the API's own tenant filter: the policies alone narrow the store's
    # statements (one label: the walk; two: the EXISTS) to the scope's tenant.
    store = w.rt.store
    assert isinstance(store, SqlStore)
    for labels in ({"batch": TAG}, {"batch": TAG, "customer": f"b-{TAG}"}):
        with tenancy.scope(A), store.engine.begin() as c:
            found = search_runs(c, RunFilter(labels=labels), cursor=None, limit=100).runs
        assert runs_ab["b"] not in {r.id for r in found}


def test_run_labels_is_invisible_across_tenants_in_raw_sql(
        w: InProcessWorker, database_url: str, runs_ab: dict[str, str]) -> None:
    raw = create_engine(database_url)  # the app role, nothing set: what psql would see
    b = {"i": runs_ab["b"]}
    try:
        with raw.connect() as c:
            assert c.execute(text("SELECT count(*) FROM run_labels")).scalar() == 0
            c.execute(text("SELECT set_config('agent_worker.tenant', :t, false)"), {"t": A})
            assert {r[0] for r in c.execute(text("SELECT DISTINCT tenant FROM run_labels"))} \
                == {A}
        store = w.rt.store
        assert isinstance(store, SqlStore)
        with tenancy.scope(A), store.engine.begin() as c:
            assert c.execute(text("SELECT count(*) FROM run_labels WHERE run_id = :i OR "
                                  "value = :v"), {**b, "v": f"b-{TAG}"}).scalar() == 0
            assert c.execute(text("UPDATE run_labels SET value = 'x' WHERE run_id = :i"),
                             b).rowcount == 0
            assert c.execute(text("DELETE FROM run_labels WHERE run_id = :i"), b).rowcount == 0
        with pytest.raises(DBAPIError, match="row-level security"), \
                tenancy.scope(A), store.engine.begin() as c:
            c.execute(text("INSERT INTO run_labels (run_id, key, value, tenant, created_at) "
                           "VALUES (:i, 'planted', 'x', :t, now())"), {**b, "t": B})
        with store.engine.connect() as c:
            forced = c.execute(text(
                "SELECT relrowsecurity AND relforcerowsecurity, (SELECT count(*) FROM "
                "pg_policy WHERE polrelid = c.oid) FROM pg_class c "
                "WHERE relname = 'run_labels'")).one()
        assert tuple(forced) == (True, 1)
    finally:
        raw.dispose()
    assert _as(w, B).get_run(runs_ab["b"]).labels == {"batch": TAG, "customer": f"b-{TAG}"}


def _plan(c: Any, f: RunFilter) -> dict[str, Any]:
    compiled = _query(c, f, None, 101).compile(dialect=c.dialect)
    (doc,) = c.exec_driver_sql("EXPLAIN (FORMAT JSON) " + compiled.string,
                               dict(compiled.params)).scalar_one()
    plan: dict[str, Any] = doc["Plan"]
    return plan


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("scoped", [False, True], ids=["system", "tenant"])
def test_one_label_is_an_index_walk_in_listing_order_under_the_policy(
        w: InProcessWorker, runs_ab: dict[str, str], scoped: bool) -> None:
    """Sequential scans priced out, the planner must use an index if the
    policy lets it: the label's b-tree, with key and value as its condition,
    walked in the listing's order (no Sort). ``labels @> ...`` on the run row
    could not be an index condition under the policy at all."""
    # (Parametrised by a flag, not the tenant's random name: xdist's workers
    # must collect identical test ids.)
    tenant = A if scoped else None
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with tenancy.scope(tenant), store.engine.begin() as c:
        c.execute(text("SET LOCAL enable_seqscan = off"))
        c.execute(text("SET LOCAL enable_bitmapscan = off"))
        nodes = list(_nodes(_plan(c, RunFilter(labels={"batch": TAG}, tenant=tenant))))
    walk = [n for n in nodes if n.get("Relation Name") == "run_labels"]
    assert walk and walk[0]["Node Type"] in ("Index Scan", "Index Only Scan"), nodes
    assert walk[0]["Index Name"] in ("ix_run_labels_pair", "ix_run_labels_tenant")
    assert "key" in walk[0]["Index Cond"] and "value" in walk[0]["Index Cond"]
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Seq Scan")], nodes


def test_the_policy_is_not_estimated_to_hide_nearly_every_row(
        w: InProcessWorker, runs_ab: dict[str, str]) -> None:
    """``current_setting(...) = '*'`` was estimated at 0.5 %, so with the
    query's own ``tenant =`` the planner believed a tenant's commonest status
    matched almost nothing and sorted a bitmap of all of it instead of walking
    an index that stops after a page (BENCHMARKS.md). Its rewritten form is
    estimated at one half: the estimate of every row in the system scope
    stays within a factor 2.5 of the table's row count."""
    store = w.rt.store
    assert isinstance(store, SqlStore)
    with store.engine.begin() as c:
        c.execute(text(
            "INSERT INTO runs (id, tenant, agent_name, agent_version, status, next_lap, "
            "lap_attempts, input, limits, laps_used, input_tokens, output_tokens, "
            "cost_micros, retention, recoveries, created_at, updated_at) "
            "SELECT :p || g, :t, 'tagged', '1', 'succeeded', 1, 0, '{}', '{}', 0, 0, 0, 0, "
            "'full', 0, now(), now() FROM generate_series(1, 1000) g"),
            {"p": f"est-{TAG}-", "t": A})
        c.execute(text("ANALYZE runs"))
        tuples = float(c.execute(text(
            "SELECT reltuples FROM pg_class WHERE relname = 'runs'")).scalar_one())
        (doc,) = c.exec_driver_sql("EXPLAIN (FORMAT JSON) SELECT id FROM runs").scalar_one()
        c.rollback()
    assert tuples >= 1000
    assert doc["Plan"]["Plan Rows"] >= tuples / 2.5, (doc["Plan"]["Plan Rows"], tuples)
