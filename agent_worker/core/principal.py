"""Who is acting: a principal is an id, a tenant and a set of roles.

Every API call and CLI command acts as one principal; every ``by`` the store
records (who approved, cancelled, retried, resolved) is its ``id``, never free
text from the caller. The tenant bounds what the principal sees: a run of
another tenant is simply unknown to it. ``ALL_TENANTS`` (``"*"``) is the
explicit cross-tenant scope, allowed only with the ``admin`` role: the
single-tenant default principal (see ``default_principal``) is such an admin,
so an application that never heard of tenants keeps working unchanged.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_worker.core.errors import InvalidInputError
from agent_worker.core.untrusted import check_name, check_text

if TYPE_CHECKING:  # settings imports the default role grants from authorization
    from agent_worker.core.settings import Settings

#: The tenant of a principal that crosses tenants (admins only, configured explicitly).
ALL_TENANTS = "*"
ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """An authenticated actor. ``roles`` holds role names (``submitter``,
    ``approver``, ``operator``, ``admin``) and group names (an agent's
    ``approval_owner`` names a group or a role whose members decide).

    Raises:
        InvalidInputError: an id, tenant or role that cannot be stored, or
            ``tenant="*"`` without the admin role.
    """

    id: str
    tenant: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def __init__(self, id: str, tenant: str, roles: Iterable[str] = ()) -> None:
        if isinstance(roles, str):
            raise InvalidInputError("roles must be a collection of names, not one string")
        object.__setattr__(self, "id", check_text(id, "principal id", max_chars=200))
        if not id.strip():
            raise InvalidInputError("principal id must not be blank")
        frozen = frozenset(check_name(r, "role", max_chars=200) for r in roles)
        object.__setattr__(self, "roles", frozen)
        if tenant == ALL_TENANTS:
            if ADMIN not in frozen:
                raise InvalidInputError("only an admin principal may act across tenants ('*')")
        else:
            check_name(tenant, "tenant", max_chars=200)
        object.__setattr__(self, "tenant", tenant)

    @property
    def all_tenants(self) -> bool:
        """Whether this principal explicitly crosses tenants."""
        return self.tenant == ALL_TENANTS

    def sees(self, tenant: str | None) -> bool:
        """Whether something of ``tenant`` is visible to this principal (a run
        with no tenant, from before tenancy, is visible only across tenants)."""
        return self.all_tenants or tenant == self.tenant

    def member_of(self, group: str) -> bool:
        """Whether this principal belongs to ``group`` (a role or group name, or its own id)."""
        return group == self.id or group in self.roles


def default_principal(settings: Settings) -> Principal:
    """The principal of the module-level functions and the CLI, from
    ``AGENT_WORKER_PRINCIPAL_*``; by default the single-tenant admin, named
    after the operating-system user (``local:alice``) so the audit log says
    who ran a command even then."""
    roles = [r.strip() for r in settings.principal_roles.split(",") if r.strip()]
    return Principal(settings.principal_id or f"local:{_os_user()}",
                     settings.principal_tenant, roles)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers)
        return "unknown"


__all__ = ["ADMIN", "ALL_TENANTS", "Principal", "default_principal"]
