"""One runtime per worker process, built after fork (never shared across it)."""

from __future__ import annotations

from typing import Any

from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_init, worker_process_init, worker_process_shutdown

from agent_worker.clock import DatabaseClock
from agent_worker.engine.active_laps import ActiveLaps
from agent_worker.runtime import Runtime
from agent_worker.settings import Settings, get_settings
from agent_worker.store.db import make_engine
from agent_worker.store.lapcache import runs_to_keep
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.dbpool import worker_pool_options
from agent_worker.tasks.dispatch import CeleryDispatcher


def system_store(settings: Settings) -> SqlStore:
    """The store of our own processes (laps, sweeps, heartbeats), which act for
    every tenant: connected as the system role when one is configured (no
    row-level-security policy on the lap's statements, and a tenant-scoped
    transaction refused, ``store.tenancy``), else as the app role in the system
    scope. Principals' calls never come here: ``agent_worker.api`` builds its
    store from ``database_url``."""
    if not settings.system_database_url:
        url = settings.database_url
        return SqlStore(make_engine(url, **worker_pool_options(settings, url)))
    url = settings.system_database_url
    return SqlStore(make_engine(url, system=True, **worker_pool_options(settings, url)))


class WorkerRuntime:
    """The runtime a worker process's tasks share, with an explicit lifetime:
    built on the first task, dropped (not closed: its connections belong to the
    parent) when a pool child is forked, closed at the child's shutdown."""

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        #: Laps this process runs at once (``laps_per_process``), set when
        #: the worker starts; one for anything else that runs laps here.
        self.laps_at_once = 1

    def get(self) -> Runtime:
        if self._runtime is None:
            s = get_settings()
            store = system_store(s)
            store.lap_cache.max_runs = runs_to_keep(self.laps_at_once)
            # Workers on many hosts agree on time only through the database's clock.
            self._runtime = Runtime(store=store, dispatcher=CeleryDispatcher(), settings=s,
                                    clock=DatabaseClock(store.current_time),
                                    active_laps=ActiveLaps(
                                        s.worker_active_laps if self.laps_at_once > 1 else 0))
        return self._runtime

    def forget(self) -> None:
        """After fork: the parent's runtime (its pool, its heartbeat) is not ours."""
        self._runtime = None

    def close(self) -> None:
        """Stop the heartbeat thread and close the connections."""
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None


_worker = WorkerRuntime()


def runtime() -> Runtime:
    """This process's runtime (built on first use)."""
    return _worker.get()


def laps_per_process(pool: str | type, concurrency: object) -> int:
    """Laps one process of a worker of ``pool`` (a name or a class, as
    Celery's ``worker_pool``) at ``concurrency`` runs at once: all of them
    in a threads or green pool, one in a prefork child or a solo worker."""
    pool_cls = get_implementation(pool)
    if isinstance(concurrency, int) and (issubclass(pool_cls, ThreadsPool)
                                         or getattr(pool_cls, "is_green", False)):
        return max(concurrency, 1)
    return 1


@worker_init.connect
def _size_for_the_pool(sender: Any = None, **_: object) -> None:
    """Sent by the worker once its concurrency is known, before any lap (and,
    under prefork, before the fork: children keep the parent's one)."""
    if sender is not None:
        _worker.laps_at_once = laps_per_process(sender.pool_cls, sender.concurrency)


@worker_process_init.connect
def _fresh_after_fork(**_: object) -> None:
    _worker.forget()


@worker_process_shutdown.connect
def _dispose(**_: object) -> None:
    _worker.close()
