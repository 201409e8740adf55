"""The lap message ``CeleryDispatcher`` sends: kwargs as JSON, and the
``argsrepr``/``kwargsrepr`` headers Flower shows and searches equal to what
Celery's own ``saferepr`` would have built (the dispatcher writes them itself
to skip that walk)."""

from __future__ import annotations

import json

import pytest
from celery import Celery
from celery.utils.saferepr import saferepr
from kombu import Connection, Queue

from agent_worker.store.base import DueLap
from agent_worker.tasks.dispatch import CeleryDispatcher
from agent_worker.tasks.routing import lap_queue


@pytest.mark.parametrize("run_id", ["run-1", "rün-ü-2", "x" * 200])
def test_the_lap_message_reads_as_celery_would_write_it(run_id: str) -> None:
    app = Celery("lap-message", broker="memory://", set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    CeleryDispatcher(app).send(DueLap(run_id, 7, "loop", "1"))
    queue = Queue(lap_queue("loop", "1"))
    with Connection("memory://") as conn:
        message = queue(conn.default_channel).get(no_ack=True, accept=["json"])
    assert message is not None and message.body is not None
    kwargs = {"run_id": run_id, "lap": 7}
    assert json.loads(message.body)[1] == kwargs
    assert message.headers["kwargsrepr"] == saferepr(kwargs)
    assert message.headers["argsrepr"] == saferepr(())
    assert message.headers["agent"] == "loop@1"
