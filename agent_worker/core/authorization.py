"""May this principal do that? Roles, and the hook for an application's own IAM.

Tenant isolation is not the authorizer's business: a run of another tenant is
unknown before any authorizer is asked (``api``), so a permissive authorizer
can never open a tenant to another. The authorizer decides the rest: which
actions a principal's roles allow, and who may decide an approval.

An application with its own IAM passes any callable
``(Principal, AccessRequest) -> bool`` to ``connect(authorizer=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from agent_worker.core.errors import InvalidInputError
from agent_worker.core.principal import ADMIN, Principal

Action = Literal["read", "start", "signal", "cancel", "approve", "reject", "retry", "fork",
                 "resolve", "raise_budget", "edit_state", "audit", "share"]
ACTIONS: tuple[Action, ...] = get_args(Action)

#: The built-in roles (``AGENT_WORKER_ROLE_GRANTS`` replaces this mapping).
#: ``admin`` may do everything; operators' verbs rewrite history or lift limits.
DEFAULT_GRANTS: dict[str, list[str]] = {
    "submitter": ["read", "start", "signal", "cancel"],
    "approver": ["read", "approve", "reject"],
    "operator": ["read", "start", "signal", "cancel", "retry", "fork", "resolve",
                 "raise_budget", "edit_state", "audit", "share"],
    ADMIN: list(ACTIONS),
}


@dataclass(frozen=True)
class AccessRequest:
    """What a principal asks to do, on what.

    ``owners``: for a decision, the approval's owner (and escalation target):
    only their members decide. Empty when the approval names no owner.
    """

    action: Action
    tenant: str | None
    run_id: str | None = None
    owners: tuple[str, ...] = ()


Authorizer = Callable[[Principal, AccessRequest], bool]


class RoleAuthorizer:
    """The built-in authorizer: a principal may do what one of its roles grants;
    an approval with an owner is decided only by the owner's members (or an
    admin, who may act for anyone)."""

    def __init__(self, grants: Mapping[str, Iterable[str]]) -> None:
        self.grants: dict[str, frozenset[str]] = {}
        for role, actions in grants.items():
            unknown = set(actions) - set(ACTIONS)
            if unknown:
                raise InvalidInputError(
                    f"role {role!r} grants unknown actions {sorted(unknown)}; "
                    f"known: {', '.join(ACTIONS)}")
            self.grants[role] = frozenset(actions)

    def __call__(self, principal: Principal, request: AccessRequest) -> bool:
        if ADMIN in principal.roles:
            return True
        if not any(request.action in self.grants.get(r, ()) for r in principal.roles):
            return False
        return not request.owners or any(principal.member_of(o) for o in request.owners)


__all__ = ["ACTIONS", "DEFAULT_GRANTS", "AccessRequest", "Action", "Authorizer",
           "RoleAuthorizer"]
