"""The audit log's SQL: append (inside the verb's own transaction when one is
pending), list with filters, prune at the ledger's retention (never an entry younger
than the owner's ``audit_log_retention()`` on Postgres).

An action and its audit entry commit together or not at all: the API puts the
entry in ``pending(entry)`` around its one writing store call, and the store's
transaction (``SqlBase._tx``) appends it before committing. So an action that
failed or was rolled back leaves no entry, and one that committed has exactly
one, however often the transaction was retried. A refused attempt, which writes
nothing else, is appended in a transaction of its own (``append_audit``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import Connection, Row, Table, delete, insert, select, text

from agent_worker.store.base import AuditEntry, AuditRecord
from agent_worker.store.dbtime import db_time
from agent_worker.store.models import AuditRow

audit_log = cast(Table, AuditRow.__table__)


@dataclass
class _Pending:
    entry: AuditEntry
    now: datetime
    written: bool = False


_pending: ContextVar[_Pending | None] = ContextVar("agent_worker_pending_audit", default=None)


@contextmanager
def pending(entry: AuditEntry, *, now: datetime) -> Iterator[None]:
    """Append ``entry`` within the first store transaction that commits inside."""
    token = _pending.set(_Pending(entry, now))
    try:
        yield
    finally:
        _pending.reset(token)


def write_pending(conn: Connection) -> None:
    """Called by a store transaction just before it commits (retried ones too)."""
    p = _pending.get()
    if p is not None and not p.written:
        append_tx(conn, p.entry, p.now)


def committed() -> None:
    """The transaction that wrote the pending entry committed: no second one."""
    p = _pending.get()
    if p is not None:
        p.written = True


def append_tx(conn: Connection, entry: AuditEntry, now: datetime) -> None:
    """Append one entry, stamped with the database's time."""
    conn.execute(insert(audit_log).values(
        at=db_time(now), tenant=entry.tenant, principal=entry.principal, action=entry.action,
        outcome=entry.outcome, run_id=entry.run_id, target=entry.target, reason=entry.reason,
        changes=entry.changes))


def list_tx(conn: Connection, *, tenant: str | None, principal: str | None, action: str | None,
            run_id: str | None, since: datetime | None, limit: int) -> list[AuditRecord]:
    q = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if tenant is not None:
        q = q.where(audit_log.c.tenant == tenant)
    if principal is not None:
        q = q.where(audit_log.c.principal == principal)
    if action is not None:
        q = q.where(audit_log.c.action == action)
    if run_id is not None:
        q = q.where(audit_log.c.run_id == run_id)
    if since is not None:
        q = q.where(audit_log.c.at >= since)
    return [_record(r) for r in conn.execute(q)]


def prune_tx(conn: Connection, *, before: datetime, batch: int) -> int:
    """Delete up to ``batch`` entries older than ``before`` (the ledger's
    retention). On Postgres through ``audit_log_prune`` (migration
    ``0024_append_only_audit``), the owner's function that never deletes an
    entry younger than its own ``audit_log_retention()``, whatever ``before``
    says: the append-only trigger refuses any such DELETE."""
    if conn.dialect.name == "postgresql":
        cutoff = before.astimezone(UTC).replace(tzinfo=None)
        found = conn.execute(text("SELECT audit_log_prune(CAST(:before AS timestamp), "
                                  "CAST(:batch AS integer))"),
                             {"before": cutoff, "batch": batch})
        return int(found.scalar_one())
    ids = select(audit_log.c.id).where(audit_log.c.at < before).limit(batch)
    doomed = [r[0] for r in conn.execute(ids)]
    if not doomed:
        return 0
    return conn.execute(delete(audit_log).where(audit_log.c.id.in_(doomed))).rowcount


def _record(row: Row[tuple[object, ...]]) -> AuditRecord:
    m = row._mapping
    return AuditRecord(id=m["id"], at=m["at"], principal=m["principal"], tenant=m["tenant"],
                       action=m["action"], outcome=m["outcome"], run_id=m["run_id"],
                       target=m["target"], reason=m["reason"], changes=m["changes"])


__all__ = ["append_tx", "audit_log", "committed", "list_tx", "pending", "prune_tx",
           "write_pending"]
