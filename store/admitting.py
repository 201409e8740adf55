"""Admission: which queued laps may go to Redis now (fair share).

A lap in flight holds a *slot* from the moment admission lets its message go
until its lap commits or is released: the run is ``running``, or ``queued``
with ``admitted_lap = next_lap``. A run that asks to be sent while a cap it
falls under is full stays ``queued`` in Postgres with ``admitted_lap = -1``
(*throttled*): no message in Redis, no worker holding it, and the claim
refuses it (``statements.NOT_THROTTLED``) whatever stale message turns up.

Every admission pass runs under one transaction-scoped advisory lock on
Postgres (SQLite's single writer serialises it there), counts the slots held,
and admits waiting runs while they fit: the tenant with the fewest slots per
unit of weight goes first (weighted max-min fairness), and within a tenant the
highest ``priority``, then the oldest run. Only admission sets a run's
``admitted_lap`` to a lap, so a count taken under the lock cannot be raced by
a second admitter; a claim turns an admitted run into a running one (both
hold the slot), and a commit or release frees it. A dead worker's lap keeps
its slot through the sweeper's recovery (``sweeping.sweep``): the re-send is
admitted already, so a sweep on a process that has not registered the run's
agent sends it too.

Rate limits (``store.ratelimit``) are one more condition a pick must meet: the
pass reads the last minute's charges under the same lock and charges each lap
it admits, so a run over its rate waits like a run over its cap.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    Table,
    and_,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
    union_all,
    update,
)

from agent_worker.store import ratelimit
from agent_worker.store.base import DueLap
from agent_worker.store.dbtime import db_time
from agent_worker.store.rows import runs
from agent_worker.store.runstatus import in_flight, waiting_turn
from agent_worker.store.sharemodels import ProviderPauseRow

provider_pauses: Table = ProviderPauseRow.__table__  # type: ignore[assignment]

#: ``admitted_lap`` of a run waiting for a slot.
THROTTLED = -1
#: Transaction-scoped advisory lock that serialises admission fleet-wide.
LOCK_KEY = 0x61775F6661697231  # "aw_fair1"
#: Most waiting runs read per tenant in one pass: bounds the pass's cost
#: whatever the backlog; the rest wait for the next pass.
PER_TENANT = 64


@dataclass(frozen=True)
class AgentShare:
    """What admission knows of one agent it may admit."""

    concurrency: int | None = None
    provider: str | None = None


@dataclass(frozen=True)
class Policy:
    """Every cap and weight one admission pass applies (``None``: no cap).

    Only runs of agents named in ``agents`` are admitted by this pass (a
    process cannot know the caps of an agent it has not registered); the
    sweeper, which imports every agent module, admits the rest.
    """

    agents: Mapping[str, AgentShare]
    fleet: int | None = None
    tenant_default: int | None = None
    weight_default: float = 1.0
    tenants: Mapping[str, int | None] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)
    tenant_agents: Mapping[tuple[str, str], int | None] = field(default_factory=dict)
    providers: Mapping[str, int] = field(default_factory=dict)
    #: Rate limits (``store.ratelimit``): per tenant, every other tenant's
    #: own, and per provider key; the tokens a run's first lap is charged.
    tenant_rates: Mapping[str, ratelimit.Rate] = field(default_factory=dict)
    rate_default: ratelimit.Rate = field(default_factory=ratelimit.Rate)
    provider_rates: Mapping[str, ratelimit.Rate] = field(default_factory=dict)
    tokens_estimate: int = 1000

    def rated(self) -> bool:
        """Whether any rate limit is in force."""
        return (bool(self.rate_default) or any(self.tenant_rates.values())
                or any(self.provider_rates.values()))

    def rates(self, tenant: str, provider: str | None
              ) -> list[tuple[ratelimit.Scope, ratelimit.Rate]]:
        """The rate limits a lap of ``tenant`` on ``provider`` counts against."""
        found = [(("tenant", tenant), self.tenant_rates.get(tenant, self.rate_default))]
        if provider is not None:
            found.append((("provider", provider), self.provider_rates.get(
                provider, ratelimit.Rate())))
        return [(scope, rate) for scope, rate in found if rate]

    def tenant_cap(self, tenant: str) -> int | None:
        return self.tenants.get(tenant, self.tenant_default)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.weight_default)


@dataclass
class _Held:
    """Slots held, by each key a cap can apply to."""

    total: int = 0
    tenant: dict[str, int] = field(default_factory=dict)
    agent: dict[str, int] = field(default_factory=dict)
    pair: dict[tuple[str, str], int] = field(default_factory=dict)
    provider: dict[str, int] = field(default_factory=dict)

    def add(self, tenant: str, agent: str, provider: str | None, n: int = 1) -> None:
        self.total += n
        self.tenant[tenant] = self.tenant.get(tenant, 0) + n
        self.agent[agent] = self.agent.get(agent, 0) + n
        self.pair[(tenant, agent)] = self.pair.get((tenant, agent), 0) + n
        if provider is not None:
            self.provider[provider] = self.provider.get(provider, 0) + n

    def fits(self, policy: Policy, tenant: str, agent: str) -> bool:
        share = policy.agents[agent]
        checks = [
            (policy.tenant_cap(tenant), self.tenant.get(tenant, 0)),
            (share.concurrency, self.agent.get(agent, 0)),
            (policy.tenant_agents.get((tenant, agent)), self.pair.get((tenant, agent), 0)),
        ]
        if share.provider is not None:
            checks.append((policy.providers.get(share.provider), self.provider.get(
                share.provider, 0)))
        return all(cap is None or held < cap for cap, held in checks)


def holds_slot() -> ColumnElement[bool]:
    """The SQL condition "this run holds a slot"."""
    return or_(in_flight(),
               and_(waiting_turn(), runs.c.admitted_lap >= 0,
                    runs.c.admitted_lap == runs.c.next_lap))


def _tenant() -> ColumnElement[str]:
    return func.coalesce(runs.c.tenant, literal_column("''"))


def _held(conn: Connection, policy: Policy, known: Mapping[str, str | None]) -> _Held:
    """Slots held, counted as two index range reads (running; queued and
    admitted) rather than ``holds_slot()``'s OR, which Postgres answers by
    reading every queued row: a backlog of 2,000 waiting runs cost each pass
    2 ms under the lock, growing with the backlog."""
    held = _Held()
    count = select(_tenant().label("tenant_key"), runs.c.agent_name, func.count())
    rows = conn.execute(union_all(
        count.where(in_flight()).group_by(_tenant(), runs.c.agent_name),
        count.where(waiting_turn(), runs.c.admitted_lap >= 0,
                    runs.c.admitted_lap == runs.c.next_lap)
        .group_by(_tenant(), runs.c.agent_name)))
    for tenant, agent, n in rows:
        held.add(tenant, agent, known.get(agent), int(n))
    return held


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})


def _queue(conn: Connection, requested: Sequence[str], now: datetime) -> list[DueLap]:
    """Put the requested runs in line; return those already admitted for
    their current lap (a re-send of a message Redis or a worker lost)."""
    if not requested:
        return []
    ready = and_(runs.c.id.in_(requested), waiting_turn(),
                 or_(runs.c.wake_at.is_(None), runs.c.wake_at <= db_time(now)))
    already = conn.execute(
        select(runs.c.id, runs.c.next_lap, runs.c.agent_name, runs.c.agent_version)
        .where(ready, runs.c.admitted_lap == runs.c.next_lap)).all()
    # A run in line is stored ``queued`` (not the ``running`` a continuing lap
    # commit keeps, see store.runstatus): the line's index and ``heads`` find
    # waiting runs by ``status = 'queued'``. Only capped fleets pay this
    # non-HOT update; the claim writes ``running`` again.
    conn.execute(update(runs).where(
        ready, or_(runs.c.admitted_lap.is_(None), runs.c.admitted_lap != runs.c.next_lap))
        .values(admitted_lap=THROTTLED, status="queued"))
    return [DueLap(r.id, r.next_lap, r.agent_name, r.agent_version) for r in already]


def _paused(conn: Connection, policy: Policy, now: datetime) -> set[str]:
    """Provider keys a 429 paused (``pause_provider``) until a later time."""
    if not any(share.provider for share in policy.agents.values()):
        return set()
    return set(conn.execute(select(provider_pauses.c.provider).where(
        provider_pauses.c.until > db_time(now))).scalars())


def _room(policy: Policy, held: _Held, paused: set[str]
          ) -> tuple[list[str], list[str] | None, list[str]]:
    """Agents with room, and the tenants to read (``None``: any) or skip:
    a backlog whose caps are all full costs the pass no read of its rows."""
    agents = [a for a, share in policy.agents.items()
              if share.provider not in paused
              and (share.concurrency is None or held.agent.get(a, 0) < share.concurrency)
              and (share.provider is None or policy.providers.get(share.provider) is None
                   or held.provider.get(share.provider, 0) < policy.providers[share.provider])]
    named = set(held.tenant) | set(policy.tenants)
    full = [t for t in named if (cap := policy.tenant_cap(t)) is not None
            and held.tenant.get(t, 0) >= cap]
    if policy.tenant_default == 0:  # only tenants with a cap of their own may run
        return agents, sorted(named - set(full)), []
    return agents, None, sorted(full)


#: A tenant's line: the highest priority first, then the oldest run.
_LINE_ORDER = (runs.c.priority.desc(), runs.c.created_at, runs.c.id)


def _waiting(conn: Connection, agents: Sequence[str], now: datetime, *,
             only: Sequence[str] | None, skip: Sequence[str]) -> list[Row[Any]]:
    """The head of each tenant's line: its ``PER_TENANT`` first runs, in line
    order, tenant by tenant.

    On Postgres, a loose index scan of ``ix_runs_admission`` (status,
    admitted_lap, tenant, priority DESC, created_at, id) finds the tenants with
    someone waiting (one index probe each) and a LATERAL read of the same
    index takes at most ``PER_TENANT`` runs of each, in order: the pass reads
    the heads, not the backlog (a window function over the backlog cost 8.5 ms
    at 2,000 waiting runs, under the lock, at every pass). SQLite, a single
    process's store, keeps the window function."""
    if conn.dialect.name != "postgresql":
        return list(conn.execute(ranked_heads(agents, now, only=only, skip=skip)).all())
    # Row-level security leaves the planner a handful of rows per line (the
    # policy's current_setting() = '*' gets the default 0.5%), so it would
    # take a bitmap or sequential read of the whole line and sort it, thinking
    # the LIMIT saves nothing (seen at 10,000 waiting runs: 21 ms). Without
    # them, the ordered index range is the cheapest plan left.
    conn.execute(_PLAN, {"on": "off"})
    found = list(conn.execute(heads(agents, now, only=only, skip=skip)).all())
    conn.execute(_PLAN, {"on": "on"})
    return found


_PLAN = text("SELECT set_config('enable_bitmapscan', :on, true), "
             "set_config('enable_seqscan', :on, true)")


def heads(agents: Sequence[str], now: datetime, *, only: Sequence[str] | None,
          skip: Sequence[str]) -> Select[Any]:
    """``_waiting``'s statement on Postgres: a loose index scan of
    ``ix_runs_admission`` for the tenants, a LATERAL ``LIMIT`` for each line.

    Every condition on ``runs`` is on the bare tenant column, not
    ``_tenant()``: under row-level security Postgres makes only leakproof
    conditions index conditions, and it counts any ``COALESCE`` as leaky (the
    index was then walked from its start with the condition as a filter).
    The runs with no tenant are one more line, read by ``tenant IS NULL``.
    Each line is ordered by the index's own columns, tenant included, so the
    ordered index range is the plan even for that line."""
    waiting = and_(runs.c.status == "queued", runs.c.admitted_lap == THROTTLED)
    first = (select(runs.c.tenant.label("k")).where(waiting, runs.c.tenant.is_not(None))
             .order_by(runs.c.tenant).limit(1))
    tenants = first.cte("waiting_tenants", recursive=True)
    after = (select(runs.c.tenant).where(waiting, runs.c.tenant > tenants.c.k)
             .order_by(runs.c.tenant).limit(1).scalar_subquery())
    tenants = tenants.union_all(select(after).where(tenants.c.k.is_not(None)))
    columns = (runs.c.id, runs.c.next_lap, runs.c.agent_name, runs.c.agent_version,
               _tenant().label("tenant_key"), runs.c.priority, runs.c.created_at,
               runs.c.laps_used, runs.c.input_tokens, runs.c.output_tokens)
    due = and_(waiting, runs.c.agent_name.in_(agents),
               or_(runs.c.wake_at.is_(None), runs.c.wake_at <= db_time(now)))

    def head(of: ColumnElement[bool]) -> Select[Any]:
        return (select(*columns).where(due, of).order_by(runs.c.tenant, *_LINE_ORDER)
                .limit(PER_TENANT))

    line = head(runs.c.tenant == tenants.c.k).lateral("line")
    picked = tenants.c.k.in_(only) if only is not None else tenants.c.k.not_in(skip)
    lines = [select(line).select_from(tenants.join(line, true()))
             .where(tenants.c.k.is_not(None), picked)]
    if ("" in only) if only is not None else ("" not in skip):
        lines.append(select(head(runs.c.tenant.is_(None)).subquery()))
    found = union_all(*lines).subquery()
    return select(found).order_by(found.c.tenant_key, found.c.priority.desc(),
                                  found.c.created_at, found.c.id)


def ranked_heads(agents: Sequence[str], now: datetime, *, only: Sequence[str] | None,
                 skip: Sequence[str]) -> Select[Any]:
    """``_waiting``'s statement as one window function over the whole
    backlog: SQLite's, and Postgres's before ``ix_runs_waiting``."""
    rank = func.row_number().over(partition_by=_tenant(), order_by=_LINE_ORDER).label("rank")
    inner = (select(runs.c.id, runs.c.next_lap, runs.c.agent_name, runs.c.agent_version,
                    _tenant().label("tenant_key"), runs.c.priority, runs.c.created_at,
                    runs.c.laps_used, runs.c.input_tokens, runs.c.output_tokens, rank)
             .where(waiting_turn(), runs.c.admitted_lap == THROTTLED,
                    runs.c.agent_name.in_(agents),
                    or_(runs.c.wake_at.is_(None), runs.c.wake_at <= db_time(now)),
                    _tenant().in_(only) if only is not None else _tenant().not_in(skip))
             .subquery())
    return (select(inner).where(inner.c.rank <= PER_TENANT)
            .order_by(inner.c.tenant_key, inner.c.rank))


def admit(conn: Connection, requested: Sequence[str], policy: Policy, *,
          now: datetime) -> list[DueLap]:
    """One admission pass (see the module docstring): put ``requested`` in
    line, then admit waiting runs while they fit. Returns every lap to send
    now, requested or not."""
    if not requested and conn.execute(select(runs.c.id).where(
            waiting_turn(), runs.c.admitted_lap == THROTTLED,
            runs.c.agent_name.in_(list(policy.agents))).limit(1)).first() is None:
        # A hand-on or a sweep with nobody waiting that this process could
        # admit (only its own agents'): one indexed read, no lock. Runs of
        # agents it does not know wait for a process that does.
        return []
    _lock(conn)
    send = _queue(conn, requested, now)
    known = {name: share.provider for name, share in policy.agents.items()}
    held = _held(conn, policy, known)
    free = None if policy.fleet is None else policy.fleet - held.total
    if not known or (free is not None and free <= 0):
        return send
    agents, only, skip = _room(policy, held, _paused(conn, policy, now))
    if not agents or only == []:
        return send
    lines: dict[str, list[Row[Any]]] = {}
    for row in _waiting(conn, agents, now, only=only, skip=skip):
        lines.setdefault(row.tenant_key, []).append(row)
    heap = [(held.tenant.get(t, 0) / policy.weight(t), line[0].created_at, t)
            for t, line in lines.items()]
    heapq.heapify(heap)
    window = ratelimit.read_window(conn, now) if policy.rated() else None
    chosen: list[Row[Any]] = []
    charges: list[dict[str, Any]] = []
    while heap and (free is None or free > 0):
        _, _, tenant = heapq.heappop(heap)
        line = lines[tenant]
        pick = next((r for r in line if held.fits(policy, tenant, r.agent_name)), None)
        # Over its rate, the tenant's line waits as it stands: skipping to a
        # smaller lap that fits would starve the larger ones behind it.
        if pick is None or not _within_rate(window, policy, pick):
            continue
        line.remove(pick)
        chosen.append(pick)
        held.add(tenant, pick.agent_name, known[pick.agent_name])
        if window is not None:
            charges.append(_charge(window, policy, pick, known[pick.agent_name]))
        free = None if free is None else free - 1
        if line:
            heapq.heappush(heap, (held.tenant[tenant] / policy.weight(tenant),
                                  line[0].created_at, tenant))
    if chosen:
        ids = [r.id for r in chosen]
        # The hand-off (store.sweeping) starts now, on the database's clock.
        conn.execute(update(runs).where(runs.c.id.in_(ids))
                     .values(admitted_lap=runs.c.next_lap, enqueued_at=db_time(now),
                             lease_expires_at=None))
        send += [DueLap(r.id, r.next_lap, r.agent_name, r.agent_version)
                 for r in chosen]
        ratelimit.charge(conn, charges, now)
    return send


def _within_rate(window: ratelimit.Window | None, policy: Policy, row: Row[Any]) -> bool:
    if window is None:
        return True
    provider = policy.agents[row.agent_name].provider
    return window.fits(policy.rates(row.tenant_key, provider),
                       ratelimit.estimate(row, policy.tokens_estimate))


def _charge(window: ratelimit.Window, policy: Policy, row: Row[Any],
            provider: str | None) -> dict[str, Any]:
    """Count an admitted lap in this pass's window; the row to log for it."""
    tokens = ratelimit.estimate(row, policy.tokens_estimate)
    window.add([scope for scope, _ in policy.rates(row.tenant_key, provider)], tokens)
    return {"run_id": row.id, "lap": row.next_lap, "tenant": row.tenant_key,
            "provider": provider, "tokens": tokens}


__all__ = ["THROTTLED", "AgentShare", "Policy", "admit", "holds_slot"]
