"""The schedule verbs of the public API (a mixin of ``AgentWorker``): create,
read, pause, resume, delete and trigger durable schedules.

Everything a caller sends is checked before anything is written, by the rules
a run's start uses: the agent must resolve, the input must be admissible for
it (a schedule that could only ever start refused runs is refused itself),
and the cron expression and time zone must be ones that fire.
"""

from __future__ import annotations

from typing import Any

from agent_worker.access import scoped
from agent_worker.core.authorization import Action
from agent_worker.core.errors import InvalidScheduleError, UnknownScheduleError
from agent_worker.core.principal import Principal
from agent_worker.core.untrusted import check_name, clean_text
from agent_worker.core.vocabulary import CATCH_UPS, OVERLAPS, CatchUp, Overlap
from agent_worker.engine.crontimes import check_cron, next_after, zone
from agent_worker.engine.newrun import admit_input
from agent_worker.engine.schedules import fire, run_id_for
from agent_worker.runtime import Runtime
from agent_worker.store.base import RunRecord
from agent_worker.store.schedtypes import ScheduleRecord

#: Longest schedule name: its run ids (``name@<fire time>``) stay within 200.
MAX_SCHEDULE_NAME_CHARS = 100
#: Most missed fire times ``catchup="all"`` may start after one downtime.
MAX_CATCHUP_LIMIT = 1000


class ScheduleVerbs:
    """Schedules on ``self.rt``, seen and managed within the principal's tenant
    like runs (``agent_worker.access``: the actor, the tenant check and the
    authorizer come from ``AgentWorker``). Managing a schedule is starting runs
    later, so it takes the ``start`` action."""

    rt: Runtime
    principal: Principal

    def _principal(self, by: object = None) -> str:
        raise NotImplementedError  # AgentWorker's

    def _tenant_of_new_run(self, tenant: str | None) -> str | None:
        raise NotImplementedError  # AccessControl's

    def _authorize(self, action: Action, run: RunRecord | None, *,
                   owners: tuple[str, ...] = (), target: str | None = None) -> None:
        raise NotImplementedError  # AccessControl's

    def schedule(self, name: str, agent: str, cron: str = "0 2 * * *", input: Any = None, *,
                 timezone: str = "UTC", catchup: CatchUp = "skip", catchup_limit: int = 10,
                 overlap: Overlap = "skip", tenant: str | None = None,
                 version: str | None = None, paused: bool = False) -> ScheduleRecord:
        """Store a schedule that starts a run of ``agent`` with ``input`` at each
        fire time of ``cron`` read in ``timezone`` (IANA name); see
        ``engine.schedules`` for ``catchup`` and ``overlap``.

        Raises:
            InvalidScheduleError: bad cron, time zone, policy or limit.
            UnknownAgentError: no such agent (version).
            InvalidInputError: the input is not admissible for the agent.
            ScheduleExistsError: the name is taken.
        """
        # An identifier (no '@'): the run ids ``name@<fire time>`` stay unambiguous.
        name = check_name(name, "schedule name", max_chars=MAX_SCHEDULE_NAME_CHARS)
        spec = self.rt.registry.get(agent, version)
        tenant = self._tenant_of_new_run(tenant)
        self._authorize("start", None, target=name)
        zone(timezone)
        now = self.rt.clock.now()
        cron = check_cron(cron, timezone, now)
        if catchup not in CATCH_UPS:
            raise InvalidScheduleError(f"catchup must be one of {', '.join(CATCH_UPS)}")
        if overlap not in OVERLAPS:
            raise InvalidScheduleError(f"overlap must be one of {', '.join(OVERLAPS)}")
        if (not isinstance(catchup_limit, int) or isinstance(catchup_limit, bool)
                or not 1 <= catchup_limit <= MAX_CATCHUP_LIMIT):
            raise InvalidScheduleError(
                f"catchup_limit must be an integer from 1 to {MAX_CATCHUP_LIMIT}")
        input = admit_input(spec, input, self.rt.settings)
        return self.rt.store.create_schedule(ScheduleRecord(
            name=name, tenant=tenant, agent_name=spec.name, agent_version=version, cron=cron,
            timezone=timezone, input=input, catchup=catchup, catchup_limit=catchup_limit,
            overlap=overlap, paused=bool(paused), next_fire_at=next_after(cron, timezone, now),
            last_fire_at=None, last_run_id=None, created_by=self._principal("api"),
            created_at=now, updated_at=now))

    @scoped
    def get_schedule(self, name: str) -> ScheduleRecord:
        """The schedule ``name`` (its input too: reading it takes ``read``, as a
        run's does).

        Raises:
            UnknownScheduleError: no such schedule in the principal's tenant.
            PermissionDeniedError: no role allows ``read``.
        """
        found = None if not _storable(name) else self.rt.store.get_schedule(name)
        if found is None or not self.principal.sees(found.tenant):
            raise UnknownScheduleError(f"unknown schedule {clean_text(str(name))!r}")
        self._authorize("read", None, target=name)
        return found

    @scoped
    def list_schedules(self, *, tenant: str | None = None, limit: int = 100
                       ) -> list[ScheduleRecord]:
        """Schedules of the principal's tenant by name (``tenant`` narrows an
        admin's view across tenants). Raises ``PermissionDeniedError`` (no role
        allows ``read``, the rule of ``list_runs``)."""
        self._authorize("read", None)
        if tenant is not None and not _storable(tenant):
            return []
        if not self.principal.all_tenants:
            if tenant not in (None, self.principal.tenant):
                return []
            tenant = self.principal.tenant
        return self.rt.store.list_schedules(tenant=tenant, limit=limit)

    def pause_schedule(self, name: str) -> ScheduleRecord:
        """Stop firing ``name`` until ``resume_schedule``; a running run goes on."""
        self._managed(name)
        return self.rt.store.set_schedule_paused(name, paused=True, next_fire_at=None,
                                                 now=self.rt.clock.now())

    def resume_schedule(self, name: str) -> ScheduleRecord:
        """Fire ``name`` again from its next fire time after now: fire times
        that passed while it was paused are not owed (pausing means "not then")."""
        s = self._managed(name)
        now = self.rt.clock.now()
        return self.rt.store.set_schedule_paused(
            name, paused=False, next_fire_at=next_after(s.cron, s.timezone, now), now=now)

    def delete_schedule(self, name: str) -> None:
        """Delete ``name``; runs it started are untouched."""
        self._managed(name)
        if not self.rt.store.delete_schedule(name):
            raise UnknownScheduleError(f"unknown schedule {clean_text(str(name))!r}")

    def trigger_schedule(self, name: str) -> RunRecord | None:
        """Fire ``name`` now (paused or not), under its overlap policy; its
        regular fire times are unchanged. The run id carries the current second,
        so a double-clicked trigger starts one run. Returns the run, or ``None``
        when the overlap policy skipped it."""
        s = self._managed(name)
        now = self.rt.clock.now()
        at = now.replace(microsecond=0)
        firing = fire(self.rt, s, [at], claimed=None, next_fire_at=None, now=now)
        if firing.skipped:
            return None
        return self.rt.store.get_run(run_id_for(name, at))


    def _managed(self, name: str) -> ScheduleRecord:
        """The schedule, if visible to the principal and it may manage it."""
        found = self.get_schedule(name)
        self._authorize("start", None, target=name)
        return found


def _storable(value: Any) -> bool:
    return isinstance(value, str) and clean_text(value) == value


__all__ = ["MAX_CATCHUP_LIMIT", "MAX_SCHEDULE_NAME_CHARS", "ScheduleVerbs"]
