"""The checkpoint: the small state a lap resumes from, and its format ladder.

Messages are not in here (they live in the append-only message log), so a
checkpoint's size does not grow with the run's length. Every stored checkpoint
carries ``schema_version``; ``load_checkpoint`` is the single place that reads
older versions (through ``_UPGRADES``, one step per version) and refuses unknown
ones, so a format change can never be silently misread.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError

from agent_worker.core.budget import BudgetLedger
from agent_worker.core.constants import CHECKPOINT_SCHEMA_VERSION
from agent_worker.core.errors import CheckpointVersionError
from agent_worker.core.messages import Frozen, ToolCall


class PlanItem(Frozen):
    """One step of the plan an agent declares; drives progress views."""

    title: str
    done: bool = False


class PendingCall(Frozen):
    """A tool call the model asked for in an earlier lap that has not run yet,
    because it waits for an approval, a timer or a signal. Its idempotency key
    stays that of the lap that asked for it."""

    call: ToolCall
    lap: int
    index: int
    paused_at: datetime | None = None
    wake_at: datetime | None = None


class Checkpoint(Frozen):
    """State after ``lap`` committed laps (lap 0 is the state at start)."""

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    lap: int
    agent_name: str
    agent_version: str
    plan: tuple[PlanItem, ...] = ()
    next_action: str | None = None
    facts: dict[str, Any] = Field(default_factory=dict)
    budget: BudgetLedger
    message_count: int
    summary_seq: int | None = None
    pending_calls: tuple[PendingCall, ...] = ()


def _v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """v1 called pinned facts ``scratch`` and had no pending calls or summary."""
    upgraded = {k: v for k, v in state.items() if k != "scratch"}
    upgraded["facts"] = state.get("scratch", {})
    upgraded["schema_version"] = 2
    return upgraded


_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def load_checkpoint(state: dict[str, Any]) -> Checkpoint:
    """Parse a stored checkpoint of any released schema version.

    Raises:
        CheckpointVersionError: the version is missing, unknown or newer than
            this code, or the payload does not match its declared version.
    """
    version = state.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointVersionError(f"checkpoint has no valid schema_version: {version!r}")
    if version > CHECKPOINT_SCHEMA_VERSION:
        raise CheckpointVersionError(
            f"checkpoint schema version {version} is newer than this worker understands "
            f"({CHECKPOINT_SCHEMA_VERSION}); deploy newer code to resume it"
        )
    while version < CHECKPOINT_SCHEMA_VERSION:
        state = _UPGRADES[version](state)
        version = state["schema_version"]
    try:
        return Checkpoint.model_validate(state)
    except ValidationError as e:
        raise CheckpointVersionError(
            f"checkpoint does not match schema version {version}: {e.errors()[0]['msg']}"
        ) from e


def dump_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """The JSON form stored in the checkpoint table: fields at their default
    left out (``None``, ``{}`` facts, no pending calls, a plan item not done, a
    ledger's zero cost), so ``load_checkpoint`` reads the same checkpoint back
    and raw readers use ``.get`` with the default. A lap writes a checkpoint
    row, so each byte is WAL on every lap. ``schema_version`` is always
    written: it is what ``load_checkpoint`` reads first. Values inside
    ``facts`` and tool arguments are kept as given, ``None`` included."""
    return {"schema_version": checkpoint.schema_version,
            **checkpoint.model_dump(mode="json", exclude_defaults=True)}
