"""The value of an operator's pending state edit; its SQL
is in ``store.state``. A module of its own so ``store.base`` can name it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class StateEdit:
    """An operator's pending edit of a run's plan, facts or a note
    (``agent_worker.core.runstate.edit_of`` gives its form)."""

    id: int
    run_id: str
    edit: dict[str, Any]
    requested_by: str
    created_at: datetime
    applied_lap: int | None
    dropped_lap: int | None = None


__all__ = ["StateEdit"]
