"""Protocol constants shared by the engine, the store and the Celery adapter.

Changing any of these changes the wire or the database contract: add, never rename.
"""

from __future__ import annotations

from typing import Final

#: Celery task names are stable across releases: a rolling deploy may hand an old
#: worker a new message and vice versa (CELERY.md: unregistered names are dropped).
LAP_TASK_NAME: Final = "agent_worker.run_lap"
SWEEP_TASK_NAME: Final = "agent_worker.sweep"
PRUNE_TASK_NAME: Final = "agent_worker.prune"
SCHEDULE_TASK_NAME: Final = "agent_worker.fire_schedules"

#: Queues: sweeps never wait behind long laps.
LAPS_QUEUE: Final = "laps"
MAINT_QUEUE: Final = "maint"

#: A worker records the agent versions it serves this often (``served_versions``);
#: one silent for SERVED_TTL_SECONDS counts as gone, and the sweeper stops
#: re-sending laps to a queue no live worker consumes.
SERVED_HEARTBEAT_SECONDS: Final = 10.0
SERVED_TTL_SECONDS: Final = 35.0

#: Current checkpoint schema version; older ones go through checkpoint.upgrade().
CHECKPOINT_SCHEMA_VERSION: Final = 2

#: Suffix of the idempotency key under which a lap's model output is journaled.
MODEL_KEY_SUFFIX: Final = "model"


def effect_key(run_id: str, lap: int, call_index: int) -> str:
    """Key of a tool call: derived from the work, never from the attempt."""
    return f"{run_id}:{lap}:{call_index}"


def model_key(run_id: str, lap: int) -> str:
    """Key of a lap's model step."""
    return f"{run_id}:{lap}:{MODEL_KEY_SUFFIX}"


def compensation_key(original_key: str) -> str:
    """Key of the compensation that undoes the effect with ``original_key``."""
    return f"{original_key}:undo"
