"""The live runs read once (``store.census``) give the same fair-share lines
and unserved counts as the rows say, run by run, on both dialects: through
the store's ``queue_lines`` and through a scrape's snapshot."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from agent_worker.core.vocabulary import RUNNABLE
from agent_worker.store import stats
from agent_worker.store.admitting import THROTTLED
from agent_worker.store.rows import runs
from agent_worker.store.sharing import QueueLine
from agent_worker.store.sql import SqlStore
from tests.store_helpers import new_run

Line = tuple[str, str, int, int, int]


def _expected(rows: Iterable[Any], served: set[tuple[str, str]]
              ) -> tuple[dict[tuple[str, str], Line], dict[tuple[str, str], int]]:
    """Lines (without their oldest wait) and unserved counts, from each row as
    ``store.runstatus`` reads it (not from any grouping the store runs)."""
    lines: dict[tuple[str, str], Line] = {}
    unserved: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.status not in RUNNABLE:
            continue
        in_flight = r.status == "running" and r.lease_owner is not None
        waiting = r.lease_owner is None
        admitted = r.admitted_lap is not None and 0 <= r.admitted_lap == r.next_lap
        throttled = waiting and r.admitted_lap == THROTTLED
        key = (r.tenant or "", r.agent_name)
        _, _, f, q, t = lines.get(key, (*key, 0, 0, 0))
        lines[key] = (*key, f + (in_flight or (waiting and admitted)), q + waiting,
                      t + throttled)
        if waiting and (r.agent_name, r.agent_version) not in served:
            version = (r.agent_name, r.agent_version)
            unserved[version] = unserved.get(version, 0) + 1
    return lines, unserved


def _mine(lines: list[QueueLine], agents: set[str]) -> list[QueueLine]:
    return [q for q in lines if q.agent in agents]


def test_lines_and_unserved_equal_what_each_live_row_says(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    x, y = f"cen-x-{tag}", f"cen-y-{tag}"
    now = datetime.now(UTC)
    made = [  # (tenant, agent, version)
        ("acme", x, "1"), ("acme", x, "1"), ("acme", x, "2"), ("beta", x, "1"),
        ("beta", x, "1"), (None, y, "1"), ("beta", y, "1"), ("acme", y, "1")]
    ids = [f"cen-{tag}-{i}" for i in range(len(made))]
    for rid, (tenant, agent, version) in zip(ids, made, strict=True):
        store.create_run(new_run(rid, agent, now=now, tenant=tenant, version=version))
    assert store.claim(ids[1], 1, owner="w", now=now, lease_seconds=60, window_messages=5)
    with store.engine.begin() as conn:
        # between laps (stored running, no lease): shown queued
        conn.execute(update(runs).where(runs.c.id == ids[2]).values(status="running"))
        # waiting for a fair-share slot, the older one first in its line
        for rid, ago in ((ids[3], 20), (ids[4], 5)):
            conn.execute(update(runs).where(runs.c.id == rid).values(
                admitted_lap=THROTTLED, enqueued_at=now - timedelta(minutes=ago)))
        conn.execute(update(runs).where(runs.c.id == ids[5]).values(admitted_lap=1))  # a slot
        conn.execute(update(runs).where(runs.c.id == ids[6])
                     .values(status="succeeded", finished_at=now))  # settled: no line
        conn.execute(update(runs).where(runs.c.id == ids[7])
                     .values(status="sleeping", wake_at=now + timedelta(days=1)))
    store.heartbeat("w", [(x, "1")], now=now)
    with store.engine.connect() as conn:
        rows = conn.execute(select(runs).where(runs.c.id.in_(ids))).all()
    lines, unserved = _expected(rows, {(x, "1")})
    assert lines == {("acme", x): ("acme", x, 1, 2, 0), ("beta", x): ("beta", x, 0, 2, 2),
                     ("", y): ("", y, 1, 1, 0)}  # the case this test sets up
    assert unserved == {(x, "2"): 1, (y, "1"): 1}

    snap = stats.snapshot(store, stale_before=now)
    for got in (_mine(store.queue_lines(now=datetime.now(UTC)), {x, y}),
                _mine(snap.queue_lines, {x, y})):
        assert [(q.tenant, q.agent, q.in_flight, q.queued, q.throttled) for q in got] == \
            sorted(lines.values())
        waits = {(q.tenant, q.agent): q.oldest_wait_seconds for q in got}
        assert waits[("", y)] is None and waits[("acme", x)] is None
        # 20 minutes, read on the database's clock a few seconds later
        assert 20 * 60 <= (waits[("beta", x)] or 0) < 20 * 60 + 60
    assert {k: v for k, v in snap.unserved.items() if k[0] in (x, y)} == unserved
