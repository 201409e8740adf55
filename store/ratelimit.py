"""Rate limits shared by the fleet: laps and model tokens per minute, per
tenant and per provider key.

**Algorithm: a sliding-window log in Postgres.** Every lap admission lets go
is charged one row of ``rate_charges``, keyed ``(run_id, lap)`` like the lap
itself: one lap, and its estimated tokens. A tenant (or key) may be admitted
another lap only if the charges of the last ``WINDOW_SECONDS``, plus this
lap's estimate, stay within its limits. The lap's commit then *sets* the row's
tokens to the usage the provider reported (``correct``), so later admissions
see what was really spent.

Why a log and not a token bucket: the key makes both the charge and its
correction idempotent (``ON CONFLICT DO NOTHING``; an UPDATE that sets, not
adds), so a redelivered message, a retried lap or a re-admission never
charges twice and a replayed commit never refunds twice, which a bucket's
running balance cannot tell apart. The sum over a window is exact (no burst
at a fixed window's edge), and its cost is one aggregate over the last
minute's rows on an index of ``at``: at most as many rows as laps per minute.
No library fits: ``limits`` and its kin keep their counters in Redis or
memory, while the decision must be made in the admission transaction, under
its advisory lock, in the store that is the truth (Redis only carries hints).

**Race-free.** Charges are read and written only inside an admission pass,
which holds the fleet-wide advisory lock (SQLite's single writer serialises it
there): two workers cannot both admit the last token. ``correct`` changes one
existing row and needs no lock; a correction landing while a pass runs is seen
by that pass or the next one.

**Waiting.** A run over its rate stays ``queued`` and throttled
(``admitted_lap = -1``) like a run waiting for a slot; no process sleeps. The
next pass (a lap's hand-on, or the sweeper's every sweep interval) admits it
once charges have left the window.

The estimate before the call is the run's own mean tokens per lap so far
(its budget totals on the run row), or ``rate_tokens_estimate`` for a run's
first lap: admission runs before the lap loads its messages, and a lap's
request is its previous request plus what that lap added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, Table, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from agent_worker.store.dbtime import db_time
from agent_worker.store.sharemodels import RateChargeRow

rate_charges: Table = RateChargeRow.__table__  # type: ignore[assignment]

#: The sliding window, in seconds.
WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Rate:
    """Limits per ``WINDOW_SECONDS`` (``None``: no limit of that kind)."""

    laps: int | None = None
    tokens: int | None = None

    def __bool__(self) -> bool:
        return self.laps is not None or self.tokens is not None


#: A scope a rate applies to: ``("tenant", name)`` or ``("provider", key)``.
Scope = tuple[str, str]


@dataclass
class Window:
    """Laps and tokens charged per scope within the window, grown as one pass
    admits (so one pass cannot overshoot either)."""

    used: dict[Scope, list[int]] = field(default_factory=dict)

    def add(self, scopes: Iterable[Scope], tokens: int) -> None:
        for scope in scopes:
            got = self.used.setdefault(scope, [0, 0])
            got[0] += 1
            got[1] += tokens

    def fits(self, limits: Sequence[tuple[Scope, Rate]], tokens: int) -> bool:
        """Whether one more lap of ``tokens`` stays within every limit. A lap
        larger than a whole minute's tokens is let through alone (an empty
        window), or it would wait for ever; a limit of 0 lets nothing through."""
        for scope, rate in limits:
            laps, spent = self.used.get(scope, (0, 0))
            if rate.laps is not None and laps + 1 > rate.laps:
                return False
            if rate.tokens is not None and (rate.tokens == 0 or (
                    spent > 0 and spent + tokens > rate.tokens)):
                return False
        return True


def read_window(conn: Connection, now: datetime) -> Window:
    """Prune charges older than the window, then sum the rest per scope."""
    start = db_time(now - timedelta(seconds=WINDOW_SECONDS), -WINDOW_SECONDS)
    conn.execute(delete(rate_charges).where(rate_charges.c.at <= start))
    window = Window()
    for tenant, provider, laps, tokens in conn.execute(
            select(rate_charges.c.tenant, rate_charges.c.provider, func.count(),
                   func.coalesce(func.sum(rate_charges.c.tokens), 0))
            .group_by(rate_charges.c.tenant, rate_charges.c.provider)):
        for scope in [("tenant", tenant)] + ([("provider", provider)] if provider else []):
            got = window.used.setdefault(scope, [0, 0])
            got[0] += int(laps)
            got[1] += int(tokens)
    return window


def estimate(row: Row[Any], default: int) -> int:
    """Tokens the lap of ``row`` (with the run's budget totals) will likely
    use: the run's mean so far, or ``default`` before its first model call."""
    if row.laps_used and row.laps_used > 0:
        return max(1, int(row.input_tokens + row.output_tokens) // int(row.laps_used))
    return default


def charge(conn: Connection, charges: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Log the admitted laps' charges (``run_id``, ``lap``, ``tenant``,
    ``provider``, ``tokens``) at the database's now; a lap charged before
    keeps its first charge."""
    if not charges:
        return
    at = conn.execute(select(db_time(now))).scalar_one()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(rate_charges).values([{**c, "at": at} for c in charges])
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["run_id", "lap"]))


def correct(conn: Connection, charge: Mapping[str, Any], now: datetime) -> None:
    """Set a committed lap's charge (``run_id``, ``lap``, ``tenant``,
    ``provider``, ``tokens``) to the tokens it really used, counted from the
    commit (the database's now), so it stays in the window for a full minute
    after the request, whenever the request was made; re-written if it had
    already left the window (a lap that waited over a minute for a worker)."""
    at = conn.execute(select(db_time(now))).scalar_one()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(rate_charges).values(**charge, at=at)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["run_id", "lap"],
        set_={"tokens": stmt.excluded.tokens, "at": stmt.excluded.at}))


__all__ = ["WINDOW_SECONDS", "Rate", "Scope", "Window", "charge", "correct", "estimate",
           "rate_charges", "read_window"]
