"""The worker's Postgres pool, sized for the laps a process runs at once.

Why not the store's default (5 kept, 5 more opened and closed per use): a
``threads`` worker runs hundreds of laps at once, each touching the database
a few times around its model call, so more than 10 of them regularly want a
connection together. Every connection past the kept ones was then opened and
closed around one statement: measured in ``bench.iobound`` as several new
Postgres sessions per second per worker (a backend fork on the server, a TLS
or password handshake and the tenancy set-up on the worker, BENCHMARKS.md
"Worker CPU per IO-bound lap"). A pool only opens what is asked of it, so a
prefork child, which runs one lap at a time, still holds one or two.
"""

from __future__ import annotations

from typing import Any

from agent_worker.core.settings import Settings

#: Connections opened past the kept ones when a burst needs them (closed after
#: use): a safety valve, not the steady state.
OVERFLOW = 10


def worker_pool_options(settings: Settings, url: str) -> dict[str, Any]:
    """``make_engine`` keyword arguments for a worker process's store on
    ``url`` (none for SQLite, whose engines pool differently)."""
    if url.startswith("sqlite"):
        return {}
    return {"pool_size": settings.worker_db_pool_size, "max_overflow": OVERFLOW}
