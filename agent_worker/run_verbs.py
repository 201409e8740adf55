"""The run verbs of the public API (a part of ``AgentWorker``): start a run
or a child run, read and list runs, read and edit a run's state, wait.

Every write commits to the store first and only then hands a lap to the
dispatcher; invalid input raises ``InvalidInputError`` (or a subclass) before
anything is written."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from agent_worker.access import check_id, ref, scoped
from agent_worker.agent import Agent
from agent_worker.core.budget import Budget, BudgetLedger
from agent_worker.core.checkpoint import load_checkpoint
from agent_worker.core.errors import InvalidInputError, InvalidStateError
from agent_worker.core.untrusted import clean_text
from agent_worker.core.vocabulary import RUN_STATUSES, TERMINAL, RunStatus
from agent_worker.engine import children
from agent_worker.engine.newrun import admit_input, admitted_run, new_run, retried_start
from agent_worker.shareapi import check_priority
from agent_worker.steering import RunStateView, check_labels, state_edit, state_view
from agent_worker.store.base import RunRecord
from agent_worker.store.edits import StateEdit
from agent_worker.store.listing import MAX_SEARCH_CHARS, RunFilter, RunPage
from agent_worker.tracing import check_traceparent, current_traceparent
from agent_worker.verbbase import Verbs, storable


class RunVerbs(Verbs):
    """Starting, reading, listing, steering and waiting for runs."""

    @scoped
    def start_run(self, agent: str | Agent, input: Any = None, *, run_id: str | None = None,
                  tenant: str | None = None, version: str | None = None,
                  budget: Budget | None = None,
                  labels: Mapping[str, str] | None = None,
                  traceparent: str | None = None, priority: int = 0) -> RunRecord:
        """Create a run and send its first lap; with a ``run_id`` a retried call
        returns the existing run instead of starting a second one.

        ``labels`` (``{"customer": "acme-42"}``) tag the run for ``search_runs``
        (``steering.check_labels`` gives the rules). ``traceparent`` (W3C trace
        context; by default the caller's active OpenTelemetry span, if any) is
        stored with the run, so every lap's trace hangs under the caller's span
        (``agent_worker.tracing``). ``priority`` (-1000..1000, default 0) orders the
        run among its tenant's runs waiting for a slot (``agent_worker.fairshare``):
        higher goes first.

        ``budget`` only tightens the agent's own limits (each limit the stricter
        of the two; ``None`` there means "no tighter"); to lift a limit an
        operator uses ``raise_budget``.

        The run belongs to the principal's tenant; ``tenant`` may only repeat
        it (an admin acting across tenants names the tenant here). Run ids are
        global: an id another tenant uses raises ``RunIdUnavailableError``,
        which says nothing about that run.

        Raises:
            RunConflictError: ``run_id`` names an existing run of another
                agent or with another input (a retried start must repeat the
                original; two concurrent starts of one id with different
                inputs: the one that did not create the run gets this)."""
        name = agent.name if isinstance(agent, Agent) else agent
        if isinstance(agent, Agent) and version is None:
            version = agent.version
        spec = self.rt.registry.get(name, version)
        run_id = check_id(run_id, "run_id") if run_id is not None else uuid.uuid4().hex
        tenant = self._tenant_of_new_run(tenant)
        self._authorize("start", None, target=run_id)
        existing = self._existing(run_id, tenant)
        if existing is not None:
            if existing.agent_name == spec.name:  # else refused whatever the input
                input = admit_input(spec, input, self.rt.settings)
            return retried_start(existing, spec, input)
        priority = check_priority(priority)
        checked_labels = check_labels(labels, self.rt.settings)
        input = admit_input(spec, input, self.rt.settings)
        traceparent = (check_traceparent(traceparent) if traceparent is not None
                       else current_traceparent())
        # A caller narrows the agent's limits, never lifts them.
        new = new_run(spec, input, run_id=run_id, tenant=tenant, budget=budget,
                      now=self.rt.clock.now(), labels=checked_labels)
        with self._recorded("start", None, tenant=tenant, target=run_id,
                            changes={"agent": spec.name, "version": spec.version,
                                     "limits": new.limits}):
            run, created = self.rt.store.create_run(
                replace(new, traceparent=traceparent, priority=priority))
        if not created:
            # Raced with another start of this id, which won: this call gets
            # that run only if it asked for the same one.
            self._claimable(run, tenant)  # another tenant's start of this id
            return retried_start(run, spec, input)
        self._send_next(run)
        return run

    @scoped
    def start_child(self, parent_run_id: str, agent: str | Agent, input: Any = None, *,
                    key: str, version: str | None = None, budget: Budget | None = None
                    ) -> RunRecord:
        """Start a child run of ``parent_run_id`` from application code, once per
        ``key`` (a retried call returns the same child). The child inherits the
        parent's tenant, the caller's principal and an even share of what is left
        of the parent's budget (``budget`` only tightens it); cancelling the
        parent cancels it. Unlike a tool's children, the parent does not wait
        for it, and its spend is not charged to the parent (nobody collects it).

        Raises:
            UnknownRunError: no such parent run (or one of another tenant).
            InvalidStateError: the parent ended.
            ChildLimitError: a child limit (depth, per call, per run) is reached.
        """
        parent = self.get_run(parent_run_id)
        key = check_id(key, "key")
        self._authorize("start", parent, target=key)
        if parent.finished or parent.cancel_requested_at is not None:
            raise InvalidStateError(f"run {parent.id} is {parent.status}; it starts no children")
        spec = self.rt.registry.get(agent.name if isinstance(agent, Agent) else agent,
                                    agent.version if isinstance(agent, Agent) else version)
        state = self.rt.store.get_checkpoint(parent.id, parent.lap)
        ledger = (load_checkpoint(state).budget if state is not None
                  else BudgetLedger(started_at=self.rt.clock.now()))
        limits = spec.budget.tightened_by(children.budget_share(parent.limits, ledger, 1))
        group = f"{parent.id}:api:{key}"
        new = admitted_run(self.rt, spec, input, run_id=children.child_id(group, 0),
                           tenant=parent.tenant, limits=limits.tightened_by(budget))
        s = self.rt.settings
        due = self.rt.store.start_children(
            parent.id, group, [new], now=self.rt.clock.now(), owner=None,
            max_depth=s.max_child_depth, max_per_run=s.max_children_per_run,
            principal=self._principal("api"))
        self.rt.send_all(due)
        return self.get_run(new.id)

    @scoped
    def list_runs(self, *, status: RunStatus | None = None, agent: str | None = None,
                  agent_version: str | None = None, tenant: str | None = None,
                  stale: bool = False, limit: int = 100, parent: str | None = None
                  ) -> list[RunRecord]:
        """Runs of the principal's tenant, newest first; ``stale`` keeps
        runnable runs with no checkpoint for longer than ``stale_after_seconds``;
        ``parent`` keeps the runs it started (child runs) or forked.
        ``tenant`` narrows an admin's view across tenants; another tenant's
        name matches nothing for everyone else."""
        self._authorize("read", None)
        if not self.principal.all_tenants:
            if tenant not in (None, self.principal.tenant):
                return []
            tenant = self.principal.tenant
        stale_before = (self.rt.clock.now()
                        - timedelta(seconds=self.rt.settings.stale_after_seconds)
                        if stale else None)
        if not storable(status, agent, agent_version, tenant, parent):
            return []  # nothing stored can match
        return self.rt.store.list_runs(status=status, agent=agent, agent_version=agent_version,
                                       tenant=tenant, stale_before=stale_before, limit=limit,
                                       parent=parent)

    @scoped
    def search_runs(self, *, labels: Mapping[str, str] | None = None,
                    status: RunStatus | None = None, agent: str | None = None,
                    agent_version: str | None = None, tenant: str | None = None,
                    created_after: datetime | None = None,
                    created_before: datetime | None = None,
                    cursor: str | None = None, limit: int = 100,
                    text: str | None = None, oldest: bool = False) -> RunPage:
        """Runs matching every filter given, newest first (``oldest``: oldest
        first), one page at a time: pass the page's ``next_cursor`` back for
        the next (``None`` on the last). Filters are checked like what they
        match (a label that could never be stored is refused), and ``limit``
        is 1..1000. ``text`` finds runs by id prefix, agent, label value or
        error text; it reads a bounded window of runs per page
        (``store.listing``), so a page may hold fewer runs than ``limit`` and
        still have a next one.

        Raises:
            InvalidInputError: a malformed filter, cursor or limit.
        """
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError(f"limit must be 1-1000, got {limit!r}")
        if status is not None and status not in RUN_STATUSES:
            raise InvalidInputError(f"status must be one of {', '.join(RUN_STATUSES)}; "
                                    f"got {clean_text(str(status))[:40]!r}")
        for when, what in ((created_after, "created_after"), (created_before, "created_before")):
            if when is not None and (not isinstance(when, datetime) or when.tzinfo is None):
                raise InvalidInputError(f"{what} must be a timezone-aware datetime")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidInputError("cursor must be a string from an earlier page")
        term = self._search_term(text)
        self._authorize("read", None)
        if not self.principal.all_tenants:
            if tenant not in (None, self.principal.tenant):
                return RunPage([], None)
            tenant = self.principal.tenant
        found = RunFilter(labels=check_labels(labels, self.rt.settings), status=status,
                          agent=agent, agent_version=agent_version, tenant=tenant,
                          created_after=created_after, created_before=created_before,
                          text=term)
        if not storable(status, agent, agent_version, tenant, term):
            return RunPage([], None)  # nothing stored can match
        return self._sql().search_runs(found, cursor=cursor, limit=limit, oldest=bool(oldest))

    @staticmethod
    def _search_term(text: object) -> str | None:
        """A caller's search term: trimmed, ``None`` when blank.

        Raises:
            InvalidInputError: not a string, or longer than ``MAX_SEARCH_CHARS``.
        """
        if text is None:
            return None
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a string, not {type(text).__name__}")
        if len(text) > MAX_SEARCH_CHARS:
            raise InvalidInputError(f"the search text is {len(text)} characters; the limit "
                                    f"is {MAX_SEARCH_CHARS}")
        return text.strip() or None

    @scoped
    def get_state(self, run_id: str) -> RunStateView:
        """The run's latest committed plan, next action, facts, budget and
        pending calls, in one query, whatever the run is doing (a lap in flight
        is not waited for: its state is visible once it commits).

        Raises:
            UnknownRunError: no such run.
        """
        found = self._sql().run_state(ref(run_id))
        if found is not None and not self.principal.sees(found.run.tenant):
            found = None  # another tenant's run is unknown, as everywhere
        view = state_view(found, run_id)
        assert found is not None  # state_view raised otherwise
        self._authorize("read", found.run)
        return view

    @scoped
    def update_state(self, run_id: str, *, facts: Mapping[str, Any] | None = None,
                     plan: Sequence[str | Mapping[str, Any]] | None = None,
                     note: str | None = None) -> StateEdit:
        """An operator's edit of a run's state, applied by the run's next lap
        commit (never under a running lap), recorded in the events: ``facts``
        are merged (a ``None`` value unpins), ``plan`` replaces the plan, and
        ``note`` is shown to the model as a message from the operator. A run
        that waits (an approval, a timer) gets it when it resumes.

        Raises:
            UnknownRunError: no such run.
            InvalidStateError: the run has finished.
            StateLimitError: a malformed edit or one over a bound.
        """
        run = self._visible(run_id)
        self._authorize("edit_state", run)
        sql = self._sql()
        edit = state_edit(sql.run_state(ref(run_id)), run_id, self.rt.settings,
                          plan=plan, facts=facts, note=note)
        with self._recorded("edit_state", run,
                            reason=clean_text(note) if isinstance(note, str) else None,
                            changes={"plan": plan is not None, "facts": sorted(facts or {}),
                                     "note": note is not None}):
            return sql.request_state_edit(run_id, edit, by=self._principal(),
                                          now=self.rt.clock.now())

    def wait(self, run_id: str, timeout: float | None = None, *, poll: float = 0.2,
             until: Callable[[RunRecord], bool] | None = None) -> RunRecord:
        """Block until the run finishes (or ``until(run)`` holds).

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        done = until or (lambda r: r.status in TERMINAL)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if done(run):
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run.status} at lap {run.lap}")
            self._idle(poll)

    def _idle(self, seconds: float) -> None:
        time.sleep(seconds)


__all__ = ["RunVerbs"]
