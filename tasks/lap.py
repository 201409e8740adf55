"""The lap task: parse, call the engine, done. Stable name; kwargs only."""

from __future__ import annotations

from celery import shared_task

from agent_worker.core.constants import LAP_TASK_NAME
from agent_worker.engine.lap import run_lap as engine_run_lap
from agent_worker.tasks.runtime import runtime


@shared_task(name=LAP_TASK_NAME, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_lap(*, run_id: str, lap: int) -> str:
    return engine_run_lap(runtime(), str(run_id), int(lap))
