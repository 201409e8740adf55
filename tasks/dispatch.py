"""Sending laps through Celery's own ``send_task``."""

from __future__ import annotations

import logging

from celery import Celery
from kombu import Queue
from kombu.exceptions import ChannelError

from agent_worker.core.constants import LAP_TASK_NAME
from agent_worker.store.base import DueLap
from agent_worker.tasks.celeryapp import get_app
from agent_worker.tasks.routing import lap_queue

log = logging.getLogger(__name__)

#: Seconds a sweep waits for the broker to say how long its lap queues are.
READ_TIMEOUT = 2


class CeleryDispatcher:
    """Sends through ``app``, by default the process's configured app
    (``celeryapp.get_app``; a benchmark driving several fleets on several
    brokers passes one app per fleet)."""

    def __init__(self, app: Celery | None = None) -> None:
        self.app = app

    def send(self, lap: DueLap) -> None:
        app = self.app or get_app()
        # run_id and lap travel as kwargs, so Flower's ``kwargs:run_id=...``
        # search finds a run's laps; the agent rides in a header, not the task
        # name (which would explode Flower's Prometheus label sets).
        kwargs = {"run_id": lap.run_id, "lap": lap.lap}
        try:
            app.send_task(
                LAP_TASK_NAME, kwargs=kwargs, queue=lap_queue(lap.agent_name, lap.agent_version),
                headers={"agent": f"{lap.agent_name}@{lap.agent_version}"},
                # What Flower shows and searches: the very text Celery's saferepr
                # would build, without its recursive walk.
                argsrepr="()", kwargsrepr=repr(kwargs),
            )
        except Exception as e:  # Redis down: the run is committed; the sweeper re-sends
            log.warning("could not send lap %s of %s (%s); the sweeper will", lap.lap,
                        lap.run_id, e)

    def queued(self, versions: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Messages waiting in each version's lap queue (``runtime.QueueReader``),
        by a passive ``queue_declare``: the broker's own count, what Celery's
        FAQ uses to measure a queue, for any transport. A broker that does not
        answer at once is left unread (the sweeper then re-sends by age)
        rather than retried: the sweep must go on without it."""
        app = self.app or get_app()
        found: dict[tuple[str, str], int] = {}
        try:
            with app.connection_for_write(connect_timeout=READ_TIMEOUT) as conn:
                conn.ensure_connection(max_retries=0, timeout=READ_TIMEOUT)
                channel = conn.default_channel
                for version in versions:
                    def count(_name: str, messages: int, _consumers: int,
                              version: tuple[str, str] = version) -> None:
                        found[version] = messages

                    try:
                        Queue(lap_queue(*version), channel=channel,
                              on_declared=count).queue_declare(passive=True)
                    except ChannelError:  # never declared, or Redis dropped the empty list
                        found[version] = 0
        except Exception as e:
            log.warning("could not read the lap queues (%s); the sweeper re-sends by age", e)
        return found
