"""Engine construction: one engine per process, never shared across fork."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine tuned for short lap transactions.

    ``pool_pre_ping`` makes a worker survive a Postgres restart without a
    restart of its own; SQLite gets WAL and a busy timeout so the in-process
    mode tolerates a second reader.
    """
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
    return create_engine(url, pool_pre_ping=True, **kwargs)
