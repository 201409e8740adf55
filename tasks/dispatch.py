"""Sending laps through Celery's own ``send_task``."""

from __future__ import annotations

import logging

from celery import Celery

from agent_worker.constants import LAP_TASK_NAME
from agent_worker.store.base import DueLap
from agent_worker.tasks.celeryapp import get_app
from agent_worker.tasks.routing import lap_queue

log = logging.getLogger(__name__)


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
