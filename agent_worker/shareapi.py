"""The fair-share verbs of ``AgentWorker`` (issue 17): edit the per-tenant
limits table and read the queues. A mixin, so ``api.py`` only inherits it.

Changing limits is an operator's act. Until principals and roles exist
(issue 16) the actor is ``AgentWorker._principal``'s, taken in one place,
``_share_operator``: that is where the operator-role check goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_worker.errors import InvalidInputError, NotFoundError
from agent_worker.fairshare import agent_shares, policy
from agent_worker.untrusted import check_name
from store.sharing import ANY, ShareLimit, ShareStore

if TYPE_CHECKING:
    from agent_worker.runtime import Runtime

#: Bounds of ``start_run(priority=...)``.
PRIORITY_RANGE = (-1000, 1000)


class UnknownShareLimitError(NotFoundError):
    """Raised when clearing a fair-share limit that is not set."""

    code = "unknown_share_limit"


def check_priority(value: Any) -> int:
    """``value`` as a run priority, or ``InvalidInputError``."""
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInputError(f"priority must be an integer from {low} to {high}, "
                                f"not {value!r}")
    return value


def _scope(tenant: str, agent: str | None) -> tuple[str, str]:
    if tenant != ANY:
        check_name(tenant, "tenant")
    if agent is None or agent == ANY:
        return tenant, ANY
    return tenant, check_name(agent, "agent name")


@dataclass(frozen=True)
class QueueView:
    """One line of ``agent-worker queues``: a (tenant, agent)'s caps in force
    (``None``: none), weight, and its runs."""

    tenant: str
    agent: str
    tenant_cap: int | None
    agent_cap: int | None
    tenant_agent_cap: int | None
    provider: str | None
    provider_cap: int | None
    weight: float
    in_flight: int
    queued: int
    throttled: int
    oldest_wait_seconds: float | None


class FairShareVerbs:
    """Mixed into ``AgentWorker``."""

    rt: Runtime

    def _principal(self, by: str) -> str:  # pragma: no cover - AgentWorker's
        raise NotImplementedError

    def _share_operator(self) -> str:
        """Who changes limits. Issue 16: the authenticated principal, and the
        operator-role check, go here."""
        return self._principal("api")

    def _share_store(self) -> ShareStore:
        store = self.rt.store
        if not isinstance(store, ShareStore):
            raise InvalidInputError("this store has no fair-share tables")
        return store

    def set_share(self, tenant: str, *, agent: str | None = None,
                  concurrency: int | None = None, weight: float | None = None) -> ShareLimit:
        """Set a tenant's cap and weight (``agent`` None), or a cap on one
        agent's runs of that tenant; tenant ``*`` is every tenant's default.
        Replaces the row; applies fleet-wide within ``share_refresh_seconds``.
        A cap of 0 holds all of the tenant's (or pair's) runs back.

        Raises:
            InvalidInputError: bad names, a negative cap, a weight not above 0,
                a weight on an agent row, or neither value given.
        """
        tenant, agent_ = _scope(tenant, agent)
        if concurrency is None and weight is None:
            raise InvalidInputError("give a concurrency or a weight (clear_share removes a row)")
        if concurrency is not None and (isinstance(concurrency, bool)
                                        or not isinstance(concurrency, int) or concurrency < 0):
            raise InvalidInputError(f"concurrency must be an integer >= 0, not {concurrency!r}")
        if weight is not None:
            if agent_ != ANY:
                raise InvalidInputError("a weight belongs to a tenant, not to one of its agents")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                    0 < weight <= 1_000_000):
                raise InvalidInputError(f"weight must be a number above 0, not {weight!r}")
            weight = float(weight)
        by = self._share_operator()
        row = self._share_store().set_share_limit(
            tenant, agent_, concurrency=concurrency, weight=weight, by=by,
            now=self.rt.clock.now())
        self._share_changed()
        return row

    def clear_share(self, tenant: str, *, agent: str | None = None) -> None:
        """Remove a row of the limits table (its defaults apply again).

        Raises:
            UnknownShareLimitError: no such row.
        """
        tenant, agent_ = _scope(tenant, agent)
        self._share_operator()
        if not self._share_store().clear_share_limit(tenant, agent_):
            raise UnknownShareLimitError(f"no fair-share limit for tenant {tenant!r}, "
                                         f"agent {agent_!r}")
        self._share_changed()

    def _share_changed(self) -> None:
        """This process applies its own change at once, not after the refresh."""
        if self.rt.share_limits is not None:
            self.rt.share_limits.read_at = float("-inf")

    def share_limits(self) -> list[ShareLimit]:
        """Every row of the limits table."""
        return self._share_store().share_limits()

    def queues(self) -> list[QueueView]:
        """Per tenant and agent with runs queued or running: caps, in flight,
        queued, throttled (waiting for a slot) and the oldest wait."""
        pol = policy(self.rt)
        shares = agent_shares(self.rt)
        views = []
        for line in self._share_store().queue_lines(now=self.rt.clock.now()):
            share = shares.get(line.agent)
            provider = share.provider if share else None
            views.append(QueueView(
                tenant=line.tenant, agent=line.agent, tenant_cap=pol.tenant_cap(line.tenant),
                agent_cap=share.concurrency if share else None,
                tenant_agent_cap=pol.tenant_agents.get((line.tenant, line.agent)),
                provider=provider,
                provider_cap=pol.providers.get(provider) if provider else None,
                weight=pol.weight(line.tenant), in_flight=line.in_flight, queued=line.queued,
                throttled=line.throttled, oldest_wait_seconds=line.oldest_wait_seconds))
        return views


__all__ = ["PRIORITY_RANGE", "FairShareVerbs", "QueueView", "UnknownShareLimitError",
           "check_priority"]
