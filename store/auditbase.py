"""The audit log's values and its narrow store interface; the SQL is
in ``store.audit``. Kept apart from ``store.base`` so each stays small."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class AuditEntry:
    """One human or operator action (or a refused attempt), as the API records it."""

    principal: str
    tenant: str | None
    action: str
    outcome: Literal["ok", "refused"] = "ok"
    run_id: str | None = None
    target: str | None = None
    reason: str | None = None
    changes: dict[str, Any] | None = None


@dataclass(frozen=True)
class AuditRecord:
    """A stored audit entry, with its id and the database's time."""

    id: int
    at: datetime
    principal: str
    tenant: str | None
    action: str
    outcome: str
    run_id: str | None
    target: str | None
    reason: str | None
    changes: dict[str, Any] | None


class AuditStore(Protocol):
    """The append-only audit log (``store.audit``)."""

    def append_audit(self, entry: AuditEntry, *, now: datetime) -> None:
        """Append ``entry`` in a transaction of its own (refused attempts)."""
        ...

    def list_audit(self, *, tenant: str | None, principal: str | None = None,
                   action: str | None = None, run_id: str | None = None,
                   since: datetime | None = None, limit: int = 100) -> list[AuditRecord]:
        """Entries newest first; ``tenant=None`` means every tenant's."""
        ...


__all__ = ["AuditEntry", "AuditRecord", "AuditStore"]
