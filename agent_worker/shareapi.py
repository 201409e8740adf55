"""The fair-share verbs of ``AgentWorker``: edit the per-tenant
limits table and read the queues. A mixin, so ``api.py`` only inherits it.

Changing limits is an operator's act: the ``share`` action (granted to the
``operator`` and ``admin`` roles), asked of the handle's authorizer in one
place, ``_share_operator``; a refusal is audited and raises
``PermissionDeniedError``, a change is audited in its own transaction. The
limits are the fleet's: a principal bound to one tenant may change only that
tenant's rows, never another's or the ``*`` default. Reading them and the
queues takes the ``read`` action, like ``list_runs``, and a principal bound to
one tenant sees that tenant's rows only: another tenant's names, caps, weights
and who set them are its business. Views with no tenant to narrow them to
(the metrics exporter) need a principal across tenants (``fleet_view``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_worker.access import scoped
from agent_worker.core.authorization import Action
from agent_worker.core.errors import InvalidInputError, NotFoundError
from agent_worker.core.untrusted import check_name
from agent_worker.fairshare import agent_shares, policy
from agent_worker.store.sharing import ANY, ShareLimit, ShareStore

if TYPE_CHECKING:
    from agent_worker.core.principal import Principal
    from agent_worker.runtime import Runtime
    from agent_worker.store.base import RunRecord

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
    #: The tenant's rate limits in force (``None``: none).
    laps_per_minute: int | None = None
    tokens_per_minute: int | None = None


class FairShareVerbs:
    """Mixed into ``AgentWorker``."""

    rt: Runtime
    principal: Principal

    def _principal(self, by: object = None) -> str:  # pragma: no cover - AgentWorker's
        raise NotImplementedError

    def _authorize(self, action: Action, run: RunRecord | None, *,
                   owners: tuple[str, ...] = (), target: str | None = None
                   ) -> None:  # pragma: no cover - AccessControl's
        raise NotImplementedError

    def _refuse(self, action: Action, why: str, *, tenant: str | None,
                run_id: str | None = None, target: str | None = None
                ) -> None:  # pragma: no cover - AccessControl's
        raise NotImplementedError

    def _recorded(self, action: Action, run: RunRecord | None, *, target: str | None = None,
                  reason: str | None = None, changes: dict[str, Any] | None = None,
                  tenant: str | None = None
                  ) -> AbstractContextManager[None]:  # pragma: no cover - AccessControl's
        raise NotImplementedError

    def _share_operator(self, tenant: str, agent: str) -> str:
        """Who changes the row (``tenant``, ``agent``), once allowed: the
        principal, if its roles grant ``share`` and the row is its tenant's
        (or it acts across tenants). A refusal is audited, then raised.

        Raises:
            PermissionDeniedError: no role allows ``share``, or another
                tenant's row (or the ``*`` default) for a tenant-bound principal.
        """
        target = f"share:{tenant}/{agent}"
        self._authorize("share", None, target=target)
        if not self.principal.all_tenants and tenant != self.principal.tenant:
            self._refuse("share", "fair-share limits of other tenants (or their default) are "
                         "set by a principal across tenants", tenant=self.principal.tenant,
                         target=target)
        return self._principal()

    def _share_store(self) -> ShareStore:
        store = self.rt.store
        if not isinstance(store, ShareStore):
            raise InvalidInputError("this store has no fair-share tables")
        return store

    def set_share(self, tenant: str, *, agent: str | None = None,
                  concurrency: int | None = None, weight: float | None = None,
                  laps_per_minute: int | None = None,
                  tokens_per_minute: int | None = None) -> ShareLimit:
        """Set a tenant's cap, weight and rate limits (``agent`` None), or a
        cap on one agent's runs of that tenant; tenant ``*`` is every tenant's
        default (each tenant its own window of that size). Replaces the row;
        applies fleet-wide within ``share_refresh_seconds``. A cap or rate of
        0 holds all of the tenant's (or pair's) runs back.

        Raises:
            InvalidInputError: bad names, a negative cap or rate, a weight not
                above 0, a weight or rate on an agent row, or no value given.
            PermissionDeniedError: see ``_share_operator``.
        """
        tenant, agent_ = _scope(tenant, agent)
        values = {"concurrency": concurrency, "laps_per_minute": laps_per_minute,
                  "tokens_per_minute": tokens_per_minute}
        if weight is None and all(v is None for v in values.values()):
            raise InvalidInputError("give a concurrency, weight, laps_per_minute or "
                                    "tokens_per_minute (clear_share removes a row)")
        for name, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= 10**12):
                raise InvalidInputError(f"{name} must be an integer >= 0, not {value!r}")
        if agent_ != ANY and (laps_per_minute, tokens_per_minute) != (None, None):
            raise InvalidInputError("a rate limit belongs to a tenant, not to one of its agents")
        if weight is not None:
            if agent_ != ANY:
                raise InvalidInputError("a weight belongs to a tenant, not to one of its agents")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                    0 < weight <= 1_000_000):
                raise InvalidInputError(f"weight must be a number above 0, not {weight!r}")
            weight = float(weight)
        by = self._share_operator(tenant, agent_)
        with self._recorded("share", None, target=f"share:{tenant}/{agent_}",
                            tenant=None if tenant == ANY else tenant,
                            changes={**values, "weight": weight}):
            row = self._share_store().set_share_limit(
                tenant, agent_, concurrency=concurrency, weight=weight, by=by,
                now=self.rt.clock.now(), laps_per_minute=laps_per_minute,
                tokens_per_minute=tokens_per_minute)
        self._share_changed()
        return row

    def clear_share(self, tenant: str, *, agent: str | None = None) -> None:
        """Remove a row of the limits table (its defaults apply again).

        Raises:
            UnknownShareLimitError: no such row.
        """
        tenant, agent_ = _scope(tenant, agent)
        self._share_operator(tenant, agent_)
        with self._recorded("share", None, target=f"share:{tenant}/{agent_}",
                            tenant=None if tenant == ANY else tenant, reason="cleared"):
            cleared = self._share_store().clear_share_limit(tenant, agent_)
        if not cleared:
            raise UnknownShareLimitError(f"no fair-share limit for tenant {tenant!r}, "
                                         f"agent {agent_!r}")
        self._share_changed()

    def _share_changed(self) -> None:
        """This process applies its own change at once, not after the refresh."""
        if self.rt.share_limits is not None:
            self.rt.share_limits.read_at = float("-inf")

    def fleet_view(self, what: str) -> None:
        """Allow a view of the whole fleet (``what``, e.g. the metrics) only to
        a principal across tenants that may read: its figures mix every
        tenant's runs and cannot be narrowed to one. A refusal is audited.

        Raises:
            PermissionDeniedError: a principal bound to one tenant, or no role
                allows ``read``.
        """
        self._authorize("read", None, target=what)
        if not self.principal.all_tenants:
            self._refuse("read", f"{what} covers every tenant: a principal across tenants "
                         "('*') reads it", tenant=self.principal.tenant, target=what)

    @scoped
    def share_limits(self) -> list[ShareLimit]:
        """The rows of the limits table the principal sees: every row across
        tenants, else its own tenant's (not the ``*`` defaults, which another
        operator set). Raises ``PermissionDeniedError`` (no role allows ``read``)."""
        self._authorize("read", None, target="share")
        return [row for row in self._share_store().share_limits()
                if self.principal.sees(row.tenant)]

    @scoped
    def queues(self) -> list[QueueView]:
        """Per tenant and agent with runs queued or running: caps, rate
        limits, in flight, queued, throttled (waiting for a slot or for its
        rate's window) and the oldest wait; a principal bound to one tenant
        gets its tenant's lines only. Raises ``PermissionDeniedError`` (no role
        allows ``read``)."""
        self._authorize("read", None, target="queues")
        pol = policy(self.rt)
        shares = agent_shares(self.rt)
        views = []
        for line in self._share_store().queue_lines(now=self.rt.clock.now()):
            if not self.principal.sees(line.tenant or None):
                continue
            share = shares.get(line.agent)
            provider = share.provider if share else None
            rate = pol.tenant_rates.get(line.tenant, pol.rate_default)
            views.append(QueueView(
                tenant=line.tenant, agent=line.agent, tenant_cap=pol.tenant_cap(line.tenant),
                agent_cap=share.concurrency if share else None,
                tenant_agent_cap=pol.tenant_agents.get((line.tenant, line.agent)),
                provider=provider,
                provider_cap=pol.providers.get(provider) if provider else None,
                weight=pol.weight(line.tenant), in_flight=line.in_flight, queued=line.queued,
                throttled=line.throttled, oldest_wait_seconds=line.oldest_wait_seconds,
                laps_per_minute=rate.laps, tokens_per_minute=rate.tokens))
        return views


__all__ = ["PRIORITY_RANGE", "FairShareVerbs", "QueueView", "UnknownShareLimitError",
           "check_priority"]
