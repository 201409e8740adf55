"""The physical floor on this machine: what one lap cannot beat.

One bare INSERT of a lap's content (its two messages and its state as one
JSONB row) committed with fsync, plus one Redis round trip (the hop that hands
the next lap to a worker). Each figure in the report is read against it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import psycopg
import redis

from bench.common import libpq_url, log, summary
from bench.workload import TOOL_NAME, lap_spec, ledger, plan, tool_output


def lap_row(lap: int, n: int = 500) -> str:
    """The JSON a minimal durable lap would store: both messages and the state."""
    spec = lap_spec(lap, n)
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": spec.text}]
    if spec.call_args is not None:
        messages[0]["tool_calls"] = [{"id": "call_0", "name": TOOL_NAME,
                                      "arguments": spec.call_args}]
        messages.append({"role": "tool", "content": tool_output(spec.call_args["path"]),
                         "tool_call_id": "call_0", "name": TOOL_NAME})
    return json.dumps({"messages": messages,
                       "state": {"lap": lap, "plan": plan(lap), "budget": ledger(lap)}})


def bench_floor(url: str, redis_url: str, samples: int) -> dict[str, Any]:
    """Milliseconds of one fsync'd INSERT commit and one Redis round trip, and the
    bytes the INSERT stores (row and disk, measured as for the systems)."""
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("DROP TABLE IF EXISTS floor_probe")
        conn.execute("CREATE TABLE floor_probe (id bigserial PRIMARY KEY, run_id text NOT NULL, "
                     "lap int NOT NULL, body jsonb NOT NULL)")
        conn.commit()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        for lap in range(1, 21):  # warm the connection and the table's first pages
            conn.execute("INSERT INTO floor_probe (run_id, lap, body) VALUES ('warm', %s, %s)",
                         (lap, lap_row(lap)))
            conn.commit()
        before = _size(conn)
        commits = []
        for i in range(samples):
            body = lap_row(i % 499 + 1)
            t0 = time.perf_counter()
            conn.execute("INSERT INTO floor_probe (run_id, lap, body) VALUES ('floor', %s, %s)",
                         (i, body))
            conn.commit()
            commits.append((time.perf_counter() - t0) * 1e3)
        disk = (_size(conn) - before) / samples
        row = conn.execute("SELECT avg(pg_column_size(t.*) + 4), avg(octet_length(body::text)) "
                           "FROM floor_probe t WHERE run_id = 'floor'").fetchone()
        assert row is not None
        conn.execute("DROP TABLE floor_probe")
        conn.commit()
    r = redis.Redis.from_url(redis_url)
    r.ping()
    rtts = []
    for _ in range(samples):
        t0 = time.perf_counter()
        r.ping()
        rtts.append((time.perf_counter() - t0) * 1e3)
    r.close()
    commit, rtt = summary(commits), summary(rtts)
    out = {
        "insert_commit_ms": commit, "redis_rtt_ms": rtt,
        "lap_floor_ms": commit["median"] + rtt["median"],
        "three_commits_ms": 3 * commit["median"],
        "row_bytes_per_lap": float(row[0]), "json_bytes_per_lap": float(row[1]),
        "disk_bytes_per_lap": disk, "synchronous_commit": sync[0] if sync else "?",
    }
    log(f"floor: commit {commit['median']:.3f} ms, redis {rtt['median']:.3f} ms, "
        f"{out['row_bytes_per_lap']:.0f} B/lap (rows), {disk:.0f} B/lap (disk)")
    return out


def _size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_total_relation_size('floor_probe')").fetchone()
    return int(row[0]) if row else 0


class BareInsert:
    """The floor as a ``System``: each lap is one INSERT of its content, one
    fsync'd COMMIT and one Redis round trip; measured alongside the real
    systems (same turns, same storage measures)."""

    name = "bare_insert"
    owners: Mapping[str, str] = {"floor_lap": "run_id"}

    def __init__(self, url: str, redis_url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(libpq_url(url))
        self.conn.execute("CREATE TABLE IF NOT EXISTS floor_lap (id bigserial PRIMARY KEY, "
                          "run_id text NOT NULL, lap int NOT NULL, body jsonb NOT NULL)")
        self.conn.commit()
        self.redis = redis.Redis.from_url(redis_url)
        self.run("warm-n5-0000", 5)

    def run(self, rid: str, n: int) -> float:
        rows = [lap_row(lap, n) for lap in range(1, n + 1)]
        t0 = time.perf_counter()
        for lap, body in enumerate(rows, 1):
            self.conn.execute("INSERT INTO floor_lap (run_id, lap, body) VALUES (%s, %s, %s)",
                              (rid, lap, body))
            self.conn.commit()
            self.redis.ping()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()
        self.redis.close()
