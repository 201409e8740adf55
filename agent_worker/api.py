"""The public API application code calls: start runs, read them, decide
approvals, send signals, cancel, retry, fork.

Every write commits to the store first and only then hands a lap to the
dispatcher; a send that never arrives is re-sent by the sweeper. Invalid input
raises ``InvalidInputError`` (or a subclass) before anything is written.

Every call acts as the handle's principal (``agent_worker.core.principal``): it
sees only its tenant's runs (another tenant's run is "unknown", and the store's
transactions are narrowed to the tenant for Postgres row-level security,
``store.tenancy``), its authorizer decides what it may do
(``agent_worker.core.authorization``; a refusal raises ``PermissionDeniedError``
and is audited), and every action is appended to the audit log in the same
transaction as the action itself (``store.audit``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from agent_worker.agent import Agent, registry
from agent_worker.core.authorization import Authorizer
from agent_worker.core.budget import Budget
from agent_worker.core.clock import DatabaseClock
from agent_worker.core.principal import Principal
from agent_worker.core.settings import get_settings
from agent_worker.decision_verbs import DecisionVerbs
from agent_worker.engine.sweep import sweep
from agent_worker.history_verbs import HistoryVerbs
from agent_worker.run_verbs import RunVerbs
from agent_worker.runtime import Runtime
from agent_worker.schedule_verbs import ScheduleVerbs
from agent_worker.shareapi import FairShareVerbs
from agent_worker.steering import RunStateView
from agent_worker.store.base import ApprovalRecord, RunRecord, SignalRecord
from agent_worker.store.edits import StateEdit
from agent_worker.store.listing import RunPage
from agent_worker.store.schedtypes import ScheduleRecord
from agent_worker.store.sql import SqlStore
from agent_worker.streaming import StreamEvent
from agent_worker.tasks.dispatch import CeleryDispatcher


class AgentWorker(RunVerbs, DecisionVerbs, HistoryVerbs, ScheduleVerbs, FairShareVerbs):
    """A handle on one store and one dispatcher, acting as one principal;
    module functions use a default one (``connect`` binds another).
    Principals, scoping, authorization and audit: ``agent_worker.access``;
    the verbs by group: ``RunVerbs``, ``DecisionVerbs``, ``HistoryVerbs``,
    ``ScheduleVerbs``; fair-share limits: ``FairShareVerbs``."""

    def sweep(self) -> int:
        """One sweeper pass (``engine.sweep``); returns how many laps it sent."""
        return sweep(self.rt)

    @staticmethod
    def cost(run: RunRecord) -> Decimal:
        """The run's spend in currency units."""
        return Decimal(run.cost_micros) / 1_000_000


class DefaultClient:
    """The handle behind the module-level functions (``start_run``, ``approve``...).

    Built from settings on first use and owned here, so it has one lifetime:
    ``replace`` swaps it (closing a handle this object built, which nobody
    else owns), ``close`` ends it. A process that switches databases, or a test,
    says so through these instead of resetting a module global by hand.
    """

    def __init__(self) -> None:
        self._client: AgentWorker | None = None
        self._owned = False

    def get(self) -> AgentWorker:
        """The current handle, built from settings (store and Celery broker) if none."""
        if self._client is None:
            settings = get_settings()
            _load_agents(settings.agent_modules)
            store = SqlStore(settings.database_url)
            self._client = AgentWorker(Runtime(store=store, dispatcher=CeleryDispatcher(),
                                               settings=settings,
                                               clock=DatabaseClock(store.current_time)))
            self._owned = True
        return self._client

    def replace(self, client: AgentWorker | None) -> None:
        """Use ``client`` from now on (``None``: build one on next use)."""
        self.close()
        self._client, self._owned = client, False

    def close(self) -> None:
        """Close the handle if this object built it (its heartbeat and connections)."""
        if self._client is not None and self._owned:
            self._client.rt.close()
        self._client, self._owned = None, False


_default = DefaultClient()


def configure(client: AgentWorker | None) -> None:
    """Set (or with ``None`` reset) the handle the module-level functions use."""
    _default.replace(client)


def client() -> AgentWorker:
    """The default handle: the configured store and the Celery broker."""
    return _default.get()


def connect(principal: Principal | None = None, *,
            authorizer: Authorizer | None = None) -> AgentWorker:
    """A handle on the configured store and broker acting as ``principal``
    (default: the configured one, ``AGENT_WORKER_PRINCIPAL_*``); ``authorizer``
    replaces the built-in roles (``agent_worker.core.authorization``)."""
    base = client()
    return base.acting_as(principal or base.principal, authorizer=authorizer)


def _load_agents(modules: str) -> None:
    registry.load_agents(modules.split(","))


def start_run(agent: str | Agent, input: Any = None, *, run_id: str | None = None,
              tenant: str | None = None, version: str | None = None,
              budget: Budget | None = None,
              labels: Mapping[str, str] | None = None,
              traceparent: str | None = None, priority: int = 0) -> RunRecord:
    """Start a run on the default handle; see ``AgentWorker.start_run``."""
    return client().start_run(agent, input, run_id=run_id, tenant=tenant, version=version,
                              budget=budget, labels=labels, traceparent=traceparent,
                              priority=priority)


def start_child(parent_run_id: str, agent: str | Agent, input: Any = None, *, key: str,
                version: str | None = None, budget: Budget | None = None) -> RunRecord:
    """Start a child run on the default handle; see ``AgentWorker.start_child``."""
    return client().start_child(parent_run_id, agent, input, key=key, version=version,
                                budget=budget)


def get_run(run_id: str) -> RunRecord:
    return client().get_run(run_id)


def get_state(run_id: str) -> RunStateView:
    """The run's latest committed state; see ``AgentWorker.get_state``."""
    return client().get_state(run_id)


def update_state(run_id: str, *, facts: Mapping[str, Any] | None = None,
                 plan: Sequence[str | Mapping[str, Any]] | None = None,
                 note: str | None = None) -> StateEdit:
    """An operator's state edit; see ``AgentWorker.update_state``."""
    return client().update_state(run_id, facts=facts, plan=plan, note=note)


def search_runs(**filters: Any) -> RunPage:
    """One page of runs; see ``AgentWorker.search_runs``."""
    return client().search_runs(**filters)


def stream(run_id: str, *, after: int = 0) -> Iterator[StreamEvent]:
    """Follow a run on the default handle; see ``AgentWorker.stream``."""
    return client().stream(run_id, after=after)


def wait(run_id: str, timeout: float | None = None) -> RunRecord:
    return client().wait(run_id, timeout)


def list_runs(**filters: Any) -> list[RunRecord]:
    return client().list_runs(**filters)


def approve(approval_or_run: str, *, comment: str | None = None,
            arguments: Mapping[str, Any] | None = None,
            by: str | None = None) -> ApprovalRecord:
    return client().approve(approval_or_run, comment=comment, arguments=arguments, by=by)


def reject(approval_or_run: str, *, comment: str | None = None,
           by: str | None = None) -> ApprovalRecord:
    return client().reject(approval_or_run, comment=comment, by=by)


def send_signal(run_id: str, name: str, payload: Any = None) -> SignalRecord:
    return client().send_signal(run_id, name, payload)


def cancel(run_id: str, *, reason: str, by: str | None = None) -> RunRecord:
    return client().cancel(run_id, reason=reason, by=by)


def retry(run_id: str, *, by: str | None = None) -> RunRecord:
    return client().retry(run_id, by=by)


def fork(run_id: str, lap: int, *, new_run_id: str | None = None, version: str | None = None,
         facts: dict[str, Any] | None = None) -> RunRecord:
    """Fork on the default handle; see ``AgentWorker.fork``."""
    return client().fork(run_id, lap, new_run_id=new_run_id, version=version, facts=facts)


def schedule(name: str, agent: str, cron: str = "0 2 * * *", input: Any = None,
             **options: Any) -> ScheduleRecord:
    """Create a schedule on the default handle; see ``AgentWorker.schedule``."""
    return client().schedule(name, agent, cron, input, **options)


def list_schedules(**filters: Any) -> list[ScheduleRecord]:
    return client().list_schedules(**filters)


def pause_schedule(name: str) -> ScheduleRecord:
    return client().pause_schedule(name)


def resume_schedule(name: str) -> ScheduleRecord:
    return client().resume_schedule(name)


def delete_schedule(name: str) -> None:
    client().delete_schedule(name)


def trigger_schedule(name: str) -> RunRecord | None:
    return client().trigger_schedule(name)


__all__ = ["AgentWorker", "approve", "cancel", "client", "configure", "connect",
           "delete_schedule",
           "fork", "get_run", "get_state", "list_runs", "list_schedules", "pause_schedule",
           "reject", "resume_schedule", "retry", "schedule", "search_runs", "send_signal",
           "start_child", "start_run", "stream", "trigger_schedule", "update_state",
           "wait"]
