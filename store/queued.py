"""What a sweep learns from the broker about its lap queues (``store.handoffs``
uses it; kept apart so ``store.base`` can name it without importing SQL)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: An agent version: (agent name, version).
Version = tuple[str, str]


#: Reads how many lap messages the broker holds in the queue of each version
#: asked for; a version it could not read is left out. Never raises.
ReadQueues = Callable[[set[Version]], Mapping[Version, int]]


@dataclass(frozen=True)
class QueuedMessages:
    """How a sweep learns what the broker holds: ``read``, called once a pass
    for the live versions before any row is locked (a slow broker then holds
    no run), and how old a hand-off whose message is missing must be before
    it is taken for lost (``gone_seconds``): it covers the moment between a
    worker taking a message and its claim, and spaces the re-sends of one run."""

    read: ReadQueues
    gone_seconds: float


__all__ = ["QueuedMessages", "ReadQueues", "Version"]
