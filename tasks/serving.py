"""Each worker records in Postgres, every few seconds, the agent versions it
serves; the sweeper re-sends laps only to queues a live worker consumes, so a
version nobody runs any more cannot grow its Redis list.

The heartbeat runs in a thread of the worker's main process with its own
store, so a slow or unreachable database never stalls the consumer's loop.
"""

from __future__ import annotations

import logging
import socket
import threading
from datetime import UTC, datetime
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from agent_worker.core.constants import SERVED_HEARTBEAT_SECONDS
from agent_worker.core.settings import get_settings
from agent_worker.tasks.routing import lap_queue, served_pairs
from agent_worker.tasks.runtime import system_store

log = logging.getLogger(__name__)
_stop = threading.Event()
_threads: list[threading.Thread] = []


def _beat(worker: str, versions: list[tuple[str, str]]) -> None:
    store = system_store(get_settings())
    try:
        while True:
            try:
                store.heartbeat(worker, versions, now=datetime.now(UTC))
            except Exception as e:  # the database is down: the next beat retries
                log.warning("could not record served versions: %s", e)
            if _stop.wait(SERVED_HEARTBEAT_SECONDS):
                break
        store.forget_worker(worker)
    finally:
        store.dispose()


def _consumed(consumer: Any) -> list[tuple[str, str]]:
    """The versions whose lap queue this worker really consumes (``--queues``
    may name fewer than it has agents for)."""
    pairs = served_pairs(get_settings())
    queues = getattr(getattr(consumer, "task_consumer", None), "queues", None)
    if not queues:
        return pairs
    names = {q.name for q in queues}
    return [p for p in pairs if lap_queue(*p) in names]


@worker_ready.connect
def _start(sender: Any = None, **_: Any) -> None:
    worker = str(getattr(sender, "hostname", None) or socket.gethostname())
    thread = threading.Thread(target=_beat, args=(worker, _consumed(sender)),
                              name="served-versions", daemon=True)
    thread.start()
    _threads.append(thread)


@worker_shutdown.connect
def _stop_beating(**_: Any) -> None:
    # A clean stop says so at once; a killed worker counts as gone after
    # SERVED_TTL_SECONDS of silence.
    _stop.set()
    for thread in _threads:
        thread.join(timeout=5)
