"""Durable schedules as the store keeps them: values and the narrow protocol
the firing pass and the schedule verbs need (``store.schedules`` implements it).

A schedule row holds the next time it fires. The firing pass claims that time
row by row, in the same transaction that creates the run(s) and advances it,
so two beats (or a beat and ``trigger``) never start one fire time twice; the
run id derived from the schedule and the fire time is the second fence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from agent_worker.core.vocabulary import CatchUp, Overlap

if TYPE_CHECKING:
    from agent_worker.store.base import DueLap, NewRun


@dataclass(frozen=True)
class ScheduleRecord:
    """A schedule as the API and the CLI show it."""

    name: str
    tenant: str | None
    agent_name: str
    agent_version: str | None
    cron: str
    timezone: str
    input: Any
    catchup: CatchUp
    catchup_limit: int
    overlap: Overlap
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_run_id: str | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Fire:
    """One fire time to start: its run, and whether it was missed (older than
    the grace when the pass saw it: started only by a catch-up policy). The
    run's ``schedule_fired`` event records both, so ``runs show`` says why a
    run started."""

    at: datetime
    run: NewRun
    missed: bool = False


@dataclass(frozen=True)
class Firing:
    """What one firing transaction did: runs started (their first laps to
    send), fire times skipped because the previous run was still going, and
    the laps of previous runs it cancelled (to send, so they compensate)."""

    started: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    due: list[DueLap] = field(default_factory=list)


class ScheduleStore(Protocol):
    """Schedules: create, read, pause/resume, delete, and fire."""

    def create_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        """Insert ``record``.

        Raises:
            ScheduleExistsError: a schedule of that name exists.
        """
        ...

    def get_schedule(self, name: str) -> ScheduleRecord | None: ...

    def list_schedules(self, *, tenant: str | None = None, limit: int = 100
                       ) -> list[ScheduleRecord]: ...

    def set_schedule_paused(self, name: str, *, paused: bool, next_fire_at: datetime | None,
                            now: datetime) -> ScheduleRecord:
        """Pause or resume; a resume also moves ``next_fire_at`` (fire times
        passed while paused are not owed). Raises ``UnknownScheduleError``."""
        ...

    def delete_schedule(self, name: str) -> bool: ...

    def due_schedules(self, *, now: datetime, limit: int = 100) -> list[ScheduleRecord]:
        """Unpaused schedules whose ``next_fire_at`` passed on the database's clock."""
        ...

    def fire_schedule(self, name: str, *, claimed: datetime | None, next_fire_at: datetime | None,
                      fires: Sequence[Fire], by: str,
                      now: datetime) -> Firing:
        """In one transaction: lock the schedule (skipping it if another pass
        holds it), check that its next fire time is still ``claimed`` (``None``:
        a manual trigger, which neither checks nor advances it), start the run of each
        of ``fires`` in order under the overlap policy, and advance the schedule to
        ``next_fire_at``. Returns an empty ``Firing`` when the claim was lost."""
        ...
