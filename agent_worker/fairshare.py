"""Fair share across a shared fleet: every lap a process sends
passes through admission first (``store.admitting``).

Caps come from four places: settings (fleet, default per tenant, per
provider key), the agent (``Agent(concurrency=..., provider_key=...)``) and
the limits table (per tenant and per (tenant, agent), with weights), which
each process re-reads every ``share_refresh_seconds``. Rate limits (laps and
tokens per minute per tenant, tokens per minute per provider key;
``store.ratelimit``) come from settings and the same table, and are applied
by the same admission. With no cap or rate anywhere
admission is off and laps go straight to the broker, as before; the sweeper
still drains runs a removed cap left waiting.

``gate`` never raises: if admission fails (the database is away), nothing is
sent and the runs stay queued with their hand-off open, so the sweeper's
re-send (``store.sweeping``) asks admission again once it is back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from agent_worker.core.config.fairshare import provider_caps
from agent_worker.core.messages import Usage
from agent_worker.core.settings import Settings
from agent_worker.model.failures import RateLimitedError
from agent_worker.store.admitting import AgentShare, Policy
from agent_worker.store.base import DueLap, RunRecord
from agent_worker.store.ratelimit import Rate
from agent_worker.store.sharing import ANY, ShareLimit, ShareStore

if TYPE_CHECKING:
    from agent_worker.agent import Agent
    from agent_worker.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class LimitsCache:
    """The limits table as one process last read it, and what the lap path
    derives from it and the process's configuration, kept because every lap
    asked for it twice (``gate`` and ``used``): the policy (``_Built``) and
    whether the runtime's store admits at all (``_share_store``)."""

    rows: list[ShareLimit] = field(default_factory=list)
    read_at: float = float("-inf")
    built: _Built | None = None
    checked: object = None
    shares: bool = False


@dataclass(frozen=True)
class _Built:
    """A policy and what it was built from: the settings and the registered
    agents (frozen definitions, compared by identity) and the table's read."""

    settings: Settings
    agents: tuple[Agent, ...]
    read_at: float
    policy: Policy

    def still(self, settings: Settings, agents: list[Agent], read_at: float) -> bool:
        return (settings is self.settings and read_at == self.read_at
                and len(agents) == len(self.agents)
                and all(a is b for a, b in zip(agents, self.agents, strict=True)))


def build_policy(settings: Settings, agents: dict[str, AgentShare],
                 rows: list[ShareLimit]) -> Policy:
    """Every cap in force, from settings, agents and the limits table."""
    tenants: dict[str, int | None] = {}
    weights: dict[str, float] = {}
    pairs: dict[tuple[str, str], int | None] = {}
    rated: list[ShareLimit] = []
    default_cap = settings.tenant_concurrency or None
    default_weight = settings.tenant_weight
    default_rate = Rate(settings.tenant_laps_per_minute or None,
                        settings.tenant_tokens_per_minute or None)
    for row in rows:
        if row.tenant == ANY and row.agent == ANY:
            default_cap = row.concurrency if row.concurrency is not None else default_cap
            default_weight = row.weight if row.weight is not None else default_weight
            default_rate = _rate(row, default_rate)
        elif row.agent == ANY:
            if row.concurrency is not None:
                tenants[row.tenant] = row.concurrency
            if row.weight is not None:
                weights[row.tenant] = row.weight
            if row.laps_per_minute is not None or row.tokens_per_minute is not None:
                rated.append(row)
        elif row.concurrency is not None:
            pairs[(row.tenant, row.agent)] = row.concurrency
    tpm = "AGENT_WORKER_PROVIDER_TOKENS_PER_MINUTE"
    return Policy(agents=agents, fleet=settings.max_laps_in_flight or None,
                  tenant_default=default_cap, weight_default=default_weight,
                  tenants=tenants, weights=weights, tenant_agents=pairs,
                  providers=provider_caps(settings.provider_concurrency),
                  tenant_rates={r.tenant: _rate(r, default_rate) for r in rated},
                  rate_default=default_rate,
                  provider_rates={k: Rate(tokens=n) for k, n in provider_caps(
                      settings.provider_tokens_per_minute, tpm).items()},
                  tokens_estimate=settings.rate_tokens_estimate)


def _rate(row: ShareLimit, inherited: Rate) -> Rate:
    """A tenant row's rate: what it sets, else what it inherits (the ``*``
    row from settings, a tenant's own row from the ``*`` row). As with a cap,
    a limit of 0 set in the table holds the tenant's runs back."""
    return Rate(row.laps_per_minute if row.laps_per_minute is not None else inherited.laps,
                row.tokens_per_minute if row.tokens_per_minute is not None
                else inherited.tokens)


def capped(policy: Policy) -> bool:
    """Whether any cap is in force (else admission is off). An agent that
    names its provider key opts in: a 429 on that key must be able to hold
    its laps back (``rate_limited``)."""
    return (policy.fleet is not None or policy.tenant_default is not None
            or any(c is not None for c in policy.tenants.values())
            or any(c is not None for c in policy.tenant_agents.values())
            or any(a.concurrency is not None or a.provider is not None
                   for a in policy.agents.values())
            or bool(policy.providers) or policy.rated())


def agent_shares(rt: Runtime) -> dict[str, AgentShare]:
    """What this process knows of each agent it has registered (several
    versions of one agent: the tightest cap among them)."""
    shares: dict[str, AgentShare] = {}
    for agent in rt.registry.all():
        seen = shares.get(agent.name)
        caps = [c for c in (agent.concurrency, seen.concurrency if seen else None)
                if c is not None]
        shares[agent.name] = AgentShare(
            concurrency=min(caps) if caps else None,
            provider=agent.provider_key or (seen.provider if seen else None))
    return shares


def policy(rt: Runtime) -> Policy:
    """The policy in force for this process, the table re-read when stale;
    built again only when the table, the settings or the agents changed."""
    cache = _cache(rt)
    store = _share_store(rt)
    if (store is not None
            and time.monotonic() - cache.read_at >= rt.settings.share_refresh_seconds):
        cache.rows, cache.read_at = store.share_limits(), time.monotonic()
    agents = rt.registry.all()
    if cache.built is None or not cache.built.still(rt.settings, agents, cache.read_at):
        cache.built = _Built(rt.settings, tuple(agents), cache.read_at,
                             build_policy(rt.settings, agent_shares(rt), cache.rows))
    return cache.built.policy


def _cache(rt: Runtime) -> LimitsCache:
    cache = rt.share_limits
    if cache is None:
        cache = rt.share_limits = LimitsCache()
    return cache


def _share_store(rt: Runtime) -> ShareStore | None:
    """``rt.store`` if it admits (a ``ShareStore``), decided once per store
    object: isinstance against a runtime-checkable protocol inspects each of
    its members, about 5 µs, and a lap asked four times. By the object, not
    its class: a test's wrapper passes calls on through ``__getattr__``."""
    cache = _cache(rt)
    if cache.checked is not rt.store:
        cache.checked, cache.shares = rt.store, isinstance(rt.store, ShareStore)
    return cast(ShareStore, rt.store) if cache.shares else None


def gate(rt: Runtime, laps: list[DueLap], *, sweep: bool = False) -> list[DueLap]:
    """The laps that may go to the broker now: ``laps`` put through admission,
    plus any waiting run a freed slot admits. With no cap in force, ``laps``
    as they are (and, in a sweep, every run a removed cap left waiting).

    A process admits runs only of agents it has registered (it knows no other
    agent's caps): its workers' laps and the sweep, which runs on a worker of
    the maintenance queue, do. Runs it is asked to send of other agents stay
    waiting for a process that has them."""
    store = _share_store(rt)
    if store is None:
        return laps
    try:
        current = policy(rt)
        if capped(current):
            return store.admit([lap.run_id for lap in laps], current, now=rt.clock.now())
        if not sweep:
            return laps
        # No cap any more: let out whatever an earlier cap held back.
        return laps + store.admit([], Policy(agents=current.agents), now=rt.clock.now())
    except Exception as e:
        log.warning("admission failed (%s); the sweeper re-sends these laps", e)
        return []


def used(rt: Runtime, run: RunRecord, lap: int, provider: str | None,
         usage: Usage | None) -> None:
    """A lap committed: set its rate charge (an estimate at admission) to the
    tokens it really used (none if it made no model call), counted from now
    (``store.ratelimit.correct``). Only when a rate limit is in force: one
    small statement. Never raises: a lost correction leaves the estimate,
    which ages out of the window within a minute."""
    store = _share_store(rt)
    if store is None:
        return
    try:
        if policy(rt).rated():
            tokens = usage.input_tokens + usage.output_tokens if usage is not None else 0
            store.correct_charge({"run_id": run.id, "lap": lap, "tenant": run.tenant or "",
                                  "provider": provider, "tokens": tokens}, now=rt.clock.now())
    except Exception as e:
        log.warning("could not correct the rate charge of %s lap %s: %s", run.id, lap, e)


def rate_limited(rt: Runtime, agent_name: str, agent_version: str, error: Exception) -> None:
    """A lap's model call got a 429 (``RateLimitedError``) that asked for a
    wait: pause the agent's provider key fleet-wide for that long, so every
    worker's admission holds that key's laps back, not just this one's.
    Never raises (the lap is already failing; its retry goes on)."""
    retry_after = getattr(error, "retry_after", None)
    agent = rt.registry.resolve(agent_name, agent_version)
    store = rt.store
    if (not isinstance(error, RateLimitedError) or not retry_after or agent is None
            or agent.provider_key is None or not isinstance(store, ShareStore)):
        return
    try:
        store.pause_provider(agent.provider_key, seconds=float(retry_after),
                             now=rt.clock.now())
        log.warning("provider key %s rate limited: no new laps for %.1fs", agent.provider_key,
                    retry_after)
    except Exception as e:
        log.warning("could not pause provider key %s: %s", agent.provider_key, e)


__all__ = [
    "LimitsCache",
    "agent_shares",
    "build_policy",
    "capped",
    "gate",
    "policy",
    "provider_caps",
    "rate_limited",
    "used",
]
