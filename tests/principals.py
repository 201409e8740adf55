"""Acting as someone in tests: the verbs take their actor from the handle's
principal, so a test that needs "alice approved" binds alice."""

from __future__ import annotations

from typing import TypeVar

from agent_worker.api import AgentWorker
from agent_worker.core.principal import ALL_TENANTS, Principal

W = TypeVar("W", bound=AgentWorker)


def acting(worker: W, who: str, *roles: str, tenant: str = ALL_TENANTS) -> W:
    """``worker`` acting as ``who``: an admin across tenants unless told otherwise."""
    return worker.acting_as(Principal(who, tenant, roles or ("admin",)))


__all__ = ["acting"]
