"""One runtime per worker process, built after fork (never shared across it)."""

from __future__ import annotations

from celery.signals import worker_process_init, worker_process_shutdown

from agent_worker.clock import DatabaseClock
from agent_worker.runtime import Runtime
from agent_worker.settings import get_settings
from store.sql import SqlStore
from tasks.dispatch import CeleryDispatcher

_runtime: Runtime | None = None


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        s = get_settings()
        store = SqlStore(s.database_url)
        # Workers on many hosts agree on time only through the database's clock.
        _runtime = Runtime(store=store, dispatcher=CeleryDispatcher(), settings=s,
                           clock=DatabaseClock(store.current_time))
    return _runtime


@worker_process_init.connect
def _fresh_after_fork(**_: object) -> None:
    global _runtime
    _runtime = None


@worker_process_shutdown.connect
def _dispose(**_: object) -> None:
    if _runtime is not None:
        _runtime.close()
