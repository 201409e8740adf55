"""The things a lap, the sweeper and the public API share in one process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent_worker.agent import Registry, registry
from agent_worker.core.clock import Clock, SystemClock
from agent_worker.core.settings import Settings, get_settings
from agent_worker.engine.active_laps import ActiveLaps
from agent_worker.fairshare import gate
from agent_worker.store.base import DueLap, Store

if TYPE_CHECKING:
    from agent_worker.fairshare import LimitsCache


class Stoppable(Protocol):
    """A helper thread a runtime owns (the lease heartbeat) and stops on close."""

    def stop(self) -> None: ...


class Dispatcher(Protocol):
    """Hands a lap to whatever runs laps: Celery, or the in-process queue."""

    def send(self, lap: DueLap) -> None: ...


@runtime_checkable
class QueueReader(Protocol):
    """A dispatcher that can say how many lap messages its broker holds, so
    the sweeper re-sends only the messages a queue lacks (``store.handoffs``)
    instead of every hand-off that waited long in a backlog."""

    def queued(self, versions: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Messages in the lap queue of each of ``versions`` (agent, version);
        a queue it could not read is left out. Never raises."""
        ...


@dataclass
class Runtime:
    store: Store
    dispatcher: Dispatcher
    settings: Settings = field(default_factory=get_settings)
    registry: Registry = field(default_factory=lambda: registry)
    clock: Clock = field(default_factory=SystemClock)
    #: The lease heartbeat of this runtime's laps (``engine.heartbeat``), started
    #: on the first lap; owned here so closing the runtime stops its thread.
    heartbeat: Stoppable | None = field(default=None, repr=False, compare=False)
    #: The fair-share limits table as this process last read it (``agent_worker.fairshare``).
    share_limits: LimitsCache | None = field(default=None, repr=False, compare=False)
    #: How many of this process's laps work at once (``engine.active_laps``): a
    #: ``threads`` worker's setting; no limit elsewhere.
    active_laps: ActiveLaps = field(default_factory=ActiveLaps, repr=False, compare=False)

    def send_all(self, laps: list[DueLap], *, sweep: bool = False) -> int:
        """Send laps after their state is committed; a send that fails is left
        to the sweeper, which re-sends whatever Postgres says is overdue.
        Admission (``agent_worker.fairshare``) decides first which may go now:
        a capped run waits in Postgres, and a freed slot admits a waiting run,
        so an empty ``laps`` hands a slot on. Returns how many were sent."""
        admitted = gate(self, laps, sweep=sweep)
        for lap in admitted:
            self.dispatcher.send(lap)
        return len(admitted)

    def close(self) -> None:
        """Stop the heartbeat thread and close the store's connections (at
        worker shutdown or when a test is done with the runtime)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        self.store.dispose()
