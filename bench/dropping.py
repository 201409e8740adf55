"""Dropping a scratch database on a server that autovacuum may be visiting.

On Postgres 15 a non-superuser's ``DROP DATABASE ... WITH (FORCE)`` cannot end
an autovacuum worker that happens to be on the database ("must be a member of
the role whose process is being terminated"); the worker ends by itself within
moments, so the drop is tried again. One copy for the benchmarks
(``bench.common.drop_database``) and the tests (``tests.support.drop_database``):
this module imports neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: What Postgres answers while an autovacuum worker is on the database.
AUTOVACUUM_REFUSAL = "must be a member of the role"


def drop_retrying(execute: Callable[[str], object], name: str, *, attempts: int = 50,
                  pause_seconds: float = 0.1) -> None:
    """Run ``DROP DATABASE IF EXISTS name WITH (FORCE)`` through ``execute``
    (an autocommit session of the caller's), retrying only the refusal above."""
    for attempt in range(attempts):
        try:
            execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except Exception as e:
            if AUTOVACUUM_REFUSAL not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(pause_seconds)


__all__ = ["AUTOVACUUM_REFUSAL", "drop_retrying"]
