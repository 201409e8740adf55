"""The fair-share side of the store: admission, the per-tenant limits table
and the queue view operators read.

``ShareStore`` is the protocol the engine and the API use; ``SqlShareStore``
implements it over the SQL store's engine (a mixin of ``SqlStore``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import Connection, Table, case, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from agent_worker.store import admitting, ratelimit
from agent_worker.store.admitting import Policy, provider_pauses
from agent_worker.store.base import DueLap
from agent_worker.store.census import LiveGroup, live_select
from agent_worker.store.dbtime import db_time, read_now
from agent_worker.store.rows import record_lap_events
from agent_worker.store.sharemodels import ShareLimitRow
from agent_worker.store.sqlbase import SqlBase

share_limits: Table = ShareLimitRow.__table__  # type: ignore[assignment]

#: The ``agent`` of a row that applies to the whole tenant, and the ``tenant``
#: of the row every tenant without its own inherits.
ANY = "*"


@dataclass(frozen=True)
class ShareLimit:
    """One row of the limits table: ``agent == "*"`` is the whole tenant
    (its concurrency cap and weight); otherwise a cap on that tenant's runs of
    that agent. ``None`` means "not set here"."""

    tenant: str
    agent: str
    concurrency: int | None
    weight: float | None
    updated_at: datetime
    updated_by: str | None
    #: A tenant row's rate limits (``store.ratelimit``).
    laps_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class QueueLine:
    """What ``agent-worker queues`` shows for one (tenant, agent): slots held
    (``in_flight``), runs queued (admitted or not), runs waiting for a slot
    (``throttled``) and how long the oldest of those has waited."""

    tenant: str
    agent: str
    in_flight: int
    queued: int
    throttled: int
    oldest_wait_seconds: float | None


@runtime_checkable
class ShareStore(Protocol):
    """Admission and its configuration; every method owns one transaction."""

    def admit(self, requested: Sequence[str], policy: Policy, *,
              now: datetime) -> list[DueLap]: ...

    def share_limits(self) -> list[ShareLimit]: ...

    def set_share_limit(self, tenant: str, agent: str, *, concurrency: int | None,
                        weight: float | None, by: str | None, now: datetime,
                        laps_per_minute: int | None = None,
                        tokens_per_minute: int | None = None) -> ShareLimit: ...

    def correct_charge(self, charge: Mapping[str, Any], *, now: datetime) -> None: ...

    def clear_share_limit(self, tenant: str, agent: str) -> bool: ...

    def queue_lines(self, *, now: datetime) -> list[QueueLine]: ...

    def pause_provider(self, provider: str, *, seconds: float, now: datetime) -> None: ...


class SqlShareStore(SqlBase):
    """``ShareStore`` over the SQL store's engine (Postgres or SQLite)."""

    def admit(self, requested: Sequence[str], policy: Policy, *,
              now: datetime) -> list[DueLap]:
        def tx(conn: Connection) -> list[DueLap]:
            due = admitting.admit(conn, requested, policy, now=now)
            asked = set(requested)
            record_lap_events(conn, [d.run_id for d in due if d.run_id not in asked],
                              "admitted", db_time(now))
            return due

        return self._tx(tx)

    def share_limits(self) -> list[ShareLimit]:
        rows = self._read(lambda c: c.execute(
            select(share_limits).order_by(share_limits.c.tenant, share_limits.c.agent)).all())
        return [ShareLimit(**r._mapping) for r in rows]

    def set_share_limit(self, tenant: str, agent: str, *, concurrency: int | None,
                        weight: float | None, by: str | None, now: datetime,
                        laps_per_minute: int | None = None,
                        tokens_per_minute: int | None = None) -> ShareLimit:
        values: dict[str, Any] = {"tenant": tenant, "agent": agent, "concurrency": concurrency,
                                  "weight": weight, "updated_at": now, "updated_by": by,
                                  "laps_per_minute": laps_per_minute,
                                  "tokens_per_minute": tokens_per_minute}

        def tx(conn: Connection) -> ShareLimit:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            stmt = dialect.insert(share_limits).values(**values)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["tenant", "agent"],
                set_={k: stmt.excluded[k] for k in values if k not in ("tenant", "agent")}))
            return ShareLimit(**values)

        return self._tx(tx)

    def clear_share_limit(self, tenant: str, agent: str) -> bool:
        return self._tx(lambda c: c.execute(delete(share_limits).where(
            share_limits.c.tenant == tenant, share_limits.c.agent == agent)).rowcount == 1)

    def correct_charge(self, charge: Mapping[str, Any], *, now: datetime) -> None:
        """A committed lap's rate charge set to its actual tokens (``store.ratelimit``)."""
        self._tx(lambda c: ratelimit.correct(c, charge, now))

    def pause_provider(self, provider: str, *, seconds: float, now: datetime) -> None:
        """Admit no lap of ``provider``'s agents for ``seconds`` from the
        database's now; a shorter pause never shortens a longer one."""
        def tx(conn: Connection) -> None:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            until = conn.execute(select(db_time(now + timedelta(seconds=seconds),
                                                seconds))).scalar_one()
            stmt = dialect.insert(provider_pauses).values(provider=provider, until=until)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["provider"],
                set_={"until": case((stmt.excluded.until > provider_pauses.c.until,
                                     stmt.excluded.until), else_=provider_pauses.c.until)}))

        self._tx(tx)

    def queue_lines(self, *, now: datetime) -> list[QueueLine]:
        def read(conn: Connection) -> list[QueueLine]:
            groups = [LiveGroup.of(r) for r in conn.execute(live_select())]
            return lines_of(groups, at=read_now(conn, now))

        return self._read(read)


def lines_of(groups: Iterable[LiveGroup], *, at: datetime) -> list[QueueLine]:
    """The queue lines the live runs of ``groups`` make (``store.census``),
    per (tenant, agent) in that order; ``at``: the database's time now."""
    acc: dict[tuple[str, str], list[Any]] = {}
    for g in groups:
        line = acc.setdefault((g.tenant or "", g.agent_name), [0, 0, 0, None])
        line[0] += g.holding
        line[1] += g.waiting
        line[2] += g.throttled
        if g.oldest_throttled is not None and (line[3] is None or g.oldest_throttled < line[3]):
            line[3] = g.oldest_throttled
    return [QueueLine(tenant=t, agent=a, in_flight=f, queued=q, throttled=th,
                      oldest_wait_seconds=None if oldest is None
                      else max(0.0, (at - oldest).total_seconds()))
            for (t, a), (f, q, th, oldest) in sorted(acc.items())]


__all__ = ["ANY", "QueueLine", "ShareLimit", "ShareStore", "SqlShareStore", "lines_of",
           "share_limits"]
