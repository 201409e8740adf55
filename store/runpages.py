"""Paged reads of one run's history, for screens that show a page of a long
run (the run console): a window of laps with their messages and
ledger rows, a page each of messages, events and effects, and run counts by
status.

``Store.list_messages``/``list_events``/``list_effects`` return a run's
whole history, which is what replay and ``stream`` need; a page of a 500-lap
run needs 50 laps of it. One connection reads the whole window (on a busy
server every checkout and round trip counts). Kept out of the ``Store``
protocol (the lap engine never pages), like ``store.stats``. Callers check
access first (the console calls ``AgentWorker.get_run`` as the visitor, then
reads inside ``tenancy.scope``); on Postgres row-level security narrows these
reads to the scope's tenant too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Select, Table, func, select

from agent_worker.store.base import EffectRecord, EventRecord, StoredMessage
from agent_worker.store.retry import with_retry
from agent_worker.store.rows import effects, events, messages, runs, to_effect, to_event, to_message
from agent_worker.store.runstatus import shown_column
from agent_worker.store.sql import SqlStore

T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    """Which page of a newest-first list to read (``number`` from 1)."""

    number: int
    size: int


@dataclass(frozen=True)
class Window:
    """One screen of a run: laps ``first..last`` with their commit events,
    messages and ledger rows; a page each of messages, events and effects
    (newest first) with their totals and the page numbers actually read (a
    page past the end reads the last)."""

    commits: list[EventRecord]
    lap_messages: list[StoredMessage]
    lap_effects: list[EffectRecord]
    messages: tuple[list[StoredMessage], int, int]
    events: tuple[list[EventRecord], int, int]
    effects: tuple[list[EffectRecord], int, int]


def _read(store: SqlStore, fn: Callable[[Connection], T]) -> T:
    def attempt() -> T:
        with store.engine.connect() as conn:
            return fn(conn)

    return with_retry(attempt)


def _page(conn: Connection, table: Table, order: Any, run_id: str, page: Page,
          columns: Select[Any] | None = None) -> tuple[list[Any], int, int]:
    total = int(conn.execute(select(func.count()).select_from(table)
                             .where(table.c.run_id == run_id)).scalar_one())
    number = min(page.number, max(1, -(-total // page.size)))
    q = (columns if columns is not None else select(table)).where(table.c.run_id == run_id)
    rows = conn.execute(q.order_by(order).offset((number - 1) * page.size)
                        .limit(page.size)).all()
    return list(rows), total, number


def run_window(store: SqlStore, run_id: str, *, first: int, last: int, messages_page: Page,
               events_page: Page, effects_page: Page) -> Window:
    """Everything one screen of run ``run_id`` shows, in one connection."""
    message_cols = select(messages.c.seq, messages.c.lap, messages.c.body)

    def read(c: Connection) -> Window:
        commits = c.execute(select(events).where(
            events.c.run_id == run_id, events.c.kind == "lap_committed",
            events.c.lap.between(first, last)).order_by(events.c.id)).all()
        lap_msgs = c.execute(message_cols.where(
            messages.c.run_id == run_id, messages.c.lap.between(first, last))
            .order_by(messages.c.seq)).all()
        lap_fx = c.execute(select(effects).where(
            effects.c.run_id == run_id, effects.c.lap.between(first, last))).all()
        m, m_total, m_page = _page(c, messages, messages.c.seq.desc(), run_id, messages_page,
                                   message_cols)
        e, e_total, e_page = _page(c, events, events.c.id.desc(), run_id, events_page)
        f, f_total, f_page = _page(c, effects, effects.c.created_at.desc(), run_id,
                                   effects_page)
        return Window(
            commits=[to_event(r) for r in commits],
            lap_messages=[to_message(r) for r in lap_msgs],
            lap_effects=[to_effect(r) for r in lap_fx],
            messages=([to_message(r) for r in m], m_total, m_page),
            events=([to_event(r) for r in e], e_total, e_page),
            effects=([to_effect(r) for r in f], f_total, f_page))

    return _read(store, read)


def status_counts(store: SqlStore, tenant: str | None) -> dict[str, int]:
    """Runs per status, of ``tenant`` (``None``: every tenant)."""
    status = shown_column()
    q = select(status, func.count()).group_by(status)
    if tenant is not None:
        q = q.where(runs.c.tenant == tenant)
    return {str(s): int(n) for s, n in _read(store, lambda c: c.execute(q).all())}


__all__ = ["Page", "Window", "run_window", "status_counts"]
