"""Child runs as the store exposes them: where a run hangs in a
tree (``ChildLink``) and the ``ChildStore`` protocol. Imports nothing of the
store at run time, so ``store.base`` can make ``Store`` include it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent_worker.store.base import DueLap, NewRun, RunRecord


@dataclass(frozen=True)
class ChildLink:
    """Where a child run hangs in its parent's tree."""

    child_run_id: str
    parent_run_id: str
    group_key: str
    position: int
    depth: int
    principal: str | None


class ChildStore(Protocol):
    """What starting, waiting for and cancelling child runs needs."""

    def start_children(self, parent_run_id: str, group_key: str, new: Sequence[NewRun], *,
                       now: datetime, owner: str | None, max_depth: int, max_per_run: int,
                       principal: str | None = None) -> list[DueLap]:
        """Create the children of one call (or API request) that do not exist yet,
        linked to the parent; return the laps to send for those just created.
        With ``owner``, fenced on the parent's lease (and not cancelled). The
        principal is the parent's own unless given.

        Raises:
            ChildLimitError: a child would be deeper than ``max_depth`` or the
                parent would have more than ``max_per_run`` children.
            LeaseLost: ``owner`` no longer holds the parent's lease.
            UnknownRunError: no such parent.
            InvalidStateError: (without ``owner``) the parent ended or is being
                cancelled.
        """
        ...

    def child_link(self, run_id: str) -> ChildLink | None:
        """Where ``run_id`` hangs in a tree (``None``: not a child run)."""
        ...

    def list_children(self, *, group_key: str | None = None,
                      parent_run_id: str | None = None) -> list[tuple[ChildLink, RunRecord]]:
        ...

    def cancel_children(self, parent_run_id: str, *, reason: str, by: str,
                        now: datetime) -> list[DueLap]:
        """Ask every unended child to cancel; return the laps to send."""
        ...



__all__ = ["ChildLink", "ChildStore"]
