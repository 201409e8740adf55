"""Beat task: the schedules' firing pass (``engine.schedules.fire_due``).

Safe when two beats run: the pass claims each fire time in Postgres."""

from __future__ import annotations

from celery import shared_task

from agent_worker.core.constants import SCHEDULE_TASK_NAME
from agent_worker.engine.schedules import fire_due
from agent_worker.tasks.runtime import runtime


@shared_task(name=SCHEDULE_TASK_NAME, acks_late=False)
def fire_schedules() -> int:
    return fire_due(runtime())
