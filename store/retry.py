"""Which database errors are worth retrying, decided in one place.

A dropped connection, a Postgres restart, a serialization failure or a deadlock
is transient: the public store method reruns its whole transaction. Everything
else is a bug or bad data and surfaces at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from agent_worker.core.errors import RetriableStoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: SQLSTATE classes/codes that mean "try the transaction again".
_RETRIABLE_SQLSTATES = ("40001", "40P01", "08", "57P01", "57P02", "57P03", "53300")


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc`` is a transient database failure."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None)
        if sqlstate is not None:
            return str(sqlstate).startswith(_RETRIABLE_SQLSTATES)
        return isinstance(exc, OperationalError) and "locked" not in str(exc).lower()
    return False


def with_retry(fn: Callable[[], T], *, deadline_seconds: float = 30.0) -> T:
    """Run ``fn`` (one whole transaction), retrying transient failures with
    jittered exponential backoff until ``deadline_seconds`` have passed.

    Raises:
        RetriableStoreError: the database stayed unavailable past the deadline.
    """
    start = time.monotonic()
    delay = 0.05
    while True:
        try:
            return fn()
        except DBAPIError as e:
            if not is_retriable(e):
                raise
            if time.monotonic() - start + delay > deadline_seconds:
                raise RetriableStoreError(f"database unavailable: {e.orig!r}") from e
            log.warning("transient database error, retrying in %.2fs: %s", delay, e.orig)
            time.sleep(delay * (1 + random.random() / 4))
            delay = min(delay * 2, 2.0)
