"""Sending laps through Celery: ``tasks.lapsend``'s one round trip where it
applies, Celery's ``send_task`` with the same message everywhere else."""

from __future__ import annotations

import logging

from celery import Celery

from agent_worker.constants import LAP_TASK_NAME
from store.base import DueLap
from tasks.celeryapp import get_app
from tasks.lapsend import LapSender, agent_header, lap_kwargs
from tasks.routing import lap_queue

log = logging.getLogger(__name__)


class CeleryDispatcher:
    """Sends through ``app``, by default the process's one app (a benchmark
    driving several fleets on several brokers passes one app per fleet)."""

    def __init__(self, app: Celery | None = None) -> None:
        self.app = app
        self._sender: LapSender | None = None

    def _lap_sender(self, app: Celery) -> LapSender:
        sender = self._sender
        if sender is None or sender.app is not app:
            sender = self._sender = LapSender(app)
        return sender

    def send(self, lap: DueLap) -> None:
        app = self.app or get_app()
        queue = lap_queue(lap.agent_name, lap.agent_version)
        try:
            if self._lap_sender(app).send(lap, queue):
                return
            kwargs = lap_kwargs(lap)
            app.send_task(
                LAP_TASK_NAME, kwargs=kwargs, queue=queue, headers=agent_header(lap),
                # What Flower shows and searches: the very text Celery's
                # saferepr would build, without its recursive walk (about
                # 3% of a worker's CPU per lap, BENCHMARKS.md).
                argsrepr="()", kwargsrepr=repr(kwargs),
                # The lap goes to its queue by name (the anonymous exchange:
                # an LPUSH); re-declaring that queue on every send only binds
                # a copy of it to the channel to find it declared already
                # (about 80 us a send). Workers declare what they consume.
                declare=[],
            )
        except Exception as e:  # Redis down: the run is committed; the sweeper re-sends
            log.warning("could not send lap %s of %s (%s); the sweeper will", lap.lap,
                        lap.run_id, e)
