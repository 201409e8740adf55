"""Engine construction: one engine per process, never shared across fork."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from sqlalchemy import Engine, create_engine, event

from agent_worker.store import tenancy

#: JSON columns stored without the spaces ``json.dumps`` puts after ``,`` and
#: ``:`` by default: a lap writes its messages, checkpoint and event as JSON on
#: every lap, and the spaces were about 85 bytes of its ~2.4 KB.
compact_json = partial(json.dumps, separators=(",", ":"))


def make_engine(url: str, *, system: bool = False, **kwargs: Any) -> Engine:
    """An engine tuned for short lap transactions; ``system``: ``url`` names
    the system role, and the engine refuses tenant-scoped transactions
    (``store.tenancy``).

    SQLite gets WAL and a busy timeout so the in-process
    mode tolerates a second reader. ``hide_parameters``: a failed statement's
    error (logged, and stored as a lap's error) would otherwise quote its bind
    parameters, i.e. message bodies, tool results and whatever secrets they hold.
    """
    kwargs.setdefault("hide_parameters", True)
    kwargs.setdefault("json_serializer", compact_json)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", 5)
        kwargs.setdefault("max_overflow", 5)
    # Our processes are trusted with every tenant (``store.tenancy``): the
    # system scope is set once per connection, and the API narrows each
    # transaction to its principal's tenant.
    kwargs["connect_args"] = _without_jit(
        tenancy.system_connect_args(kwargs.get("connect_args", {})))
    # No pre-ping: it costs a round trip per transaction (three per lap). A
    # connection that died with a Postgres restart fails its first statement
    # as a disconnect, SQLAlchemy invalidates the pool, and store.retry reruns
    # the whole transaction on a fresh connection.
    engine = create_engine(url, **kwargs)
    tenancy.install(engine, system=system)
    return engine


def _without_jit(connect_args: dict[str, Any]) -> dict[str, Any]:
    """``connect_args`` with Postgres's JIT compiler off for the session.

    Our statements are OLTP reads and writes of a few rows (the scrape and
    the retention task read rollups and batches), and JIT spends 50-100 ms
    compiling any plan whose estimate passes ``jit_above_cost``, before it
    runs. Estimates pass it for reasons unrelated to the work: the tenancy
    policies' subplans made a 90 ms approval count of the metrics scrape
    spend 80 ms compiling at a million runs; under the admission pass's
    planner hints (``store.admitting`` turns sequential scans off, so a node
    left without an index is costed at 10^10), a 0.3 ms read of the waiting
    line took 60-130 ms in the test database, under the fleet-wide admission
    lock, on every lap its capped runs sent."""
    options = connect_args.get("options", "")
    return {**connect_args, "options": f"{options} -c jit=off".strip()}
