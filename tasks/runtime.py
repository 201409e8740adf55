"""One runtime per worker process, built after fork (never shared across it)."""

from __future__ import annotations

import warnings
from typing import Any

from celery import Celery
from celery.concurrency import get_implementation
from celery.concurrency.base import BasePool
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import (
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)

from agent_worker.core.clock import DatabaseClock
from agent_worker.core.settings import Settings, get_settings
from agent_worker.engine.active_laps import ActiveLaps
from agent_worker.runtime import Runtime
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


def pool_can_cancel(pool: str | type) -> bool:
    """Whether a worker of ``pool`` can stop a running task, which is what
    ``worker_cancel_long_running_tasks_on_connection_loss`` asks of it
    (``Request.cancel`` calls ``pool.terminate_job``): prefork kills the pool
    child (its ``terminate_job`` is bound when the pool starts, so the class
    does not show it), gevent and eventlet kill the greenlet. Threads and solo
    run the task in the worker's own process and cannot: ``BasePool``'s
    ``terminate_job`` raises ``NotImplementedError``."""
    pool_cls = get_implementation(pool)
    return (issubclass(pool_cls, get_implementation("prefork"))
            or pool_cls.terminate_job is not BasePool.terminate_job)


#: The notice Celery logs (a ``CPendingDeprecationWarning``, which its worker
#: turns on with ``'always'``) at each connection loss when
#: ``worker_cancel_long_running_tasks_on_connection_loss`` is off.
_CANCEL_BY_DEFAULT_NOTICE = r"\s*In Celery 5\.1 we introduced an optional breaking change"

#: Whether this worker turned the setting off because its pool cannot cancel.
_cancel_turned_off = False


def _quiet_cancel_notice() -> None:
    warnings.filterwarnings("ignore", message=_CANCEL_BY_DEFAULT_NOTICE,
                            category=CPendingDeprecationWarning)


@worker_init.connect
def _cancel_only_if_the_pool_can(sender: Any = None, **_: object) -> None:
    """Cancelling running laps on a broker connection loss needs a pool that
    can stop them. Under threads (or solo) every loss logged, for each running
    lap, a false "Terminating it instead" and the ``NotImplementedError`` of
    ``terminate_job`` (Celery's consumer catches it and goes on): the lap was
    never stopped. Turned off there, the lap runs on and commits, or the
    fenced commit turns a redelivered copy away (../shared/CELERY.md, broker
    blip); under prefork, gevent and eventlet the setting stays as it was.
    The consumer reads the setting at each loss, in this (the main) process."""
    global _cancel_turned_off
    app: Celery | None = getattr(sender, "app", None)
    if app is None or pool_can_cancel(sender.pool_cls):
        return
    if app.conf.worker_cancel_long_running_tasks_on_connection_loss:
        app.conf.worker_cancel_long_running_tasks_on_connection_loss = False
        _cancel_turned_off = True
        _quiet_cancel_notice()


@celeryd_after_setup.connect
def _quiet_after_celery_logging(**_: object) -> None:
    """``celery worker`` sets up its logging after ``worker_init`` and puts
    ``'always'`` in front of every Celery deprecation warning then: the
    filter goes in front again, for the notice of the setting turned off above
    only (an application that leaves it off itself keeps Celery's notice)."""
    if _cancel_turned_off:
        _quiet_cancel_notice()


@worker_process_init.connect
def _fresh_after_fork(**_: object) -> None:
    _worker.forget()


@worker_process_shutdown.connect
def _dispose(**_: object) -> None:
    _worker.close()
