"""Beat tasks: the sweeper (recovery, timers, lost messages) and retention."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from agent_worker.core.constants import PRUNE_TASK_NAME, SWEEP_TASK_NAME
from agent_worker.engine.sweep import sweep as sweep_pass
from agent_worker.tasks.runtime import runtime


@shared_task(name=SWEEP_TASK_NAME, acks_late=False)
def sweep() -> int:
    return sweep_pass(runtime())


@shared_task(name=PRUNE_TASK_NAME, acks_late=False)
def prune() -> dict[str, int]:
    rt = runtime()
    now = rt.clock.now()
    s = rt.settings
    return rt.store.prune(
        checkpoints_before=now - timedelta(days=s.checkpoint_retention_days),
        ledger_before=now - timedelta(days=s.ledger_retention_days),
        batch=s.prune_batch_size)
