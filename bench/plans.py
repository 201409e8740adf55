"""What a piece of code asks Postgres, and how Postgres answers: every SELECT
it sends, re-run under ``EXPLAIN (ANALYZE, BUFFERS)``, with the tables it reads
by sequential scan. ``bench.scale`` uses it to show which statement a size-
dependent cost comes from, and that an index removed it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event


@dataclass(frozen=True)
class Plan:
    """One statement's plan, summarised: time inside Postgres, shared buffers
    touched, and the tables it scanned sequentially (with the rows it read)."""

    sql: str
    ms: float
    buffers: int
    seq_scans: dict[str, int]

    def line(self) -> dict[str, Any]:
        return {"sql": " ".join(self.sql.split())[:160], "db_ms": round(self.ms, 2),
                "buffers": self.buffers, "seq_scans": self.seq_scans}


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def statements(engine: Engine, fn: Callable[[], object]) -> list[tuple[str, Any]]:
    """The SELECTs ``fn`` sends through ``engine`` (SQL and driver parameters)."""
    seen: list[tuple[str, Any]] = []

    def on_execute(_conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if sql.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((sql, params))

    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
    return seen


def explain(engine: Engine, sql: str, params: Any, *, first: str | None = None) -> Plan:
    """``sql`` under EXPLAIN (ANALYZE, BUFFERS), in a transaction rolled back
    (a sweeper's ``FOR UPDATE`` takes its row locks and lets them go), after
    the statement ``first`` if given (in the same transaction)."""
    with engine.connect() as conn:
        if first is not None:
            conn.exec_driver_sql(first)
        (doc,) = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).scalar_one()
        conn.rollback()
    root = doc["Plan"]
    seq: dict[str, int] = {}
    for node in _nodes(root):
        if node.get("Node Type") == "Seq Scan":
            name = str(node.get("Relation Name"))
            seq[name] = seq.get(name, 0) + int(node.get("Actual Rows", 0)) + int(
                node.get("Rows Removed by Filter", 0))
    buffers = int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0))
    return Plan(sql=sql, ms=float(doc["Execution Time"]), buffers=buffers, seq_scans=seq)


def census(engine: Engine, fn: Callable[[], object], *, first: str | None = None
           ) -> list[Plan]:
    """The plan of every SELECT ``fn`` sends, in order (each after ``first``)."""
    return [explain(engine, sql, params, first=first)
            for sql, params in statements(engine, fn)]


__all__ = ["Plan", "census", "explain", "statements"]
