"""Who acts, what they see, what they may do, and what is recorded: the part
of ``AgentWorker`` that applies a principal.

A handle acts as one ``Principal``. Every verb runs inside ``scoped`` (its
store transactions narrowed to the principal's tenant for row-level security,
``store.tenancy``), looks runs up through ``_visible`` (another tenant's run is
"unknown"), asks ``_authorize`` (the handle's authorizer; a refusal is audited
and raises ``PermissionDeniedError``), and does its one write inside
``_recorded`` (the audit entry commits with it, ``store.audit``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Self, TypeVar, cast

from agent_worker.core.authorization import AccessRequest, Action, Authorizer, RoleAuthorizer
from agent_worker.core.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    RunIdUnavailableError,
    UnknownRunError,
)
from agent_worker.core.principal import Principal, default_principal
from agent_worker.core.untrusted import check_name, clean_text
from agent_worker.runtime import Runtime
from agent_worker.store import audit, tenancy
from agent_worker.store.base import AuditEntry, RunRecord

F = TypeVar("F", bound=Callable[..., Any])


def check_id(value: str, what: str) -> str:
    """An identifier a caller chooses (run id, tenant)."""
    return check_name(value, what, max_chars=200)


def ref(value: str, what: str = "run", error: type[NotFoundError] = UnknownRunError) -> str:
    """A reference to something stored. One that can never have been stored (not
    a string, or holding U+0000 or a lone surrogate, which Postgres refuses even
    as a query parameter) is simply not found, the same on both dialects."""
    if not isinstance(value, str) or clean_text(value) != value:
        raise error(f"unknown {what} {clean_text(str(value))!r}")
    return value


def scoped(method: F) -> F:
    """Run a verb with the store's transactions narrowed to the principal's
    tenant (row-level security: a query that forgets its filter sees nothing
    of other tenants)."""

    @functools.wraps(method)
    def inner(self: AccessControl, *args: Any, **kwargs: Any) -> Any:
        with tenancy.scope(self.principal.tenant):
            return method(self, *args, **kwargs)

    return cast(F, inner)


class AccessControl:
    """The principal, its authorizer, and the checks every verb makes."""

    def __init__(self, runtime: Runtime, *, principal: Principal | None = None,
                 authorizer: Authorizer | None = None) -> None:
        self.rt = runtime
        self.principal = self._bounded(principal or default_principal(runtime.settings))
        self.authorizer: Authorizer = authorizer or RoleAuthorizer(runtime.settings.role_grants)

    def acting_as(self, principal: Principal, *, authorizer: Authorizer | None = None
                  ) -> Self:
        """The same store, dispatcher (and in-process queue) acting as ``principal``."""
        bound = copy.copy(self)
        bound.principal = self._bounded(principal)
        if authorizer is not None:
            bound.authorizer = authorizer
        return bound

    def _bounded(self, principal: Principal) -> Principal:
        """``principal``, if its id fits ``max_principal_chars`` (it is stored as ``by``)."""
        limit = self.rt.settings.max_principal_chars
        if len(principal.id) > limit:
            raise InvalidInputError(f"principal id is {len(principal.id)} characters; "
                                    f"the limit is {limit}")
        return principal

    # --- who acts, and may they -----------------------------------------------

    def _visible(self, run_id: str) -> RunRecord:
        """The run, if the principal's tenant has it; else ``UnknownRunError``
        whether or not another tenant has one of that id."""
        run = self.rt.store.get_run(ref(run_id))
        if run is None or not self.principal.sees(run.tenant):
            raise UnknownRunError(f"unknown run {run_id!r}")
        return run

    def _authorize(self, action: Action, run: RunRecord | None, *, owners: tuple[str, ...] = (),
                   target: str | None = None) -> None:
        """Ask the authorizer; a refusal is audited, then raised."""
        tenant = run.tenant if run is not None else self._own_tenant()
        request = AccessRequest(action, tenant, run.id if run else None, owners)
        if self.authorizer(self.principal, request):
            return
        why = (f"{action} is decided by members of {', '.join(owners)}" if owners
               and action in ("approve", "reject") else f"no role allows {action}")
        self._refuse(action, why, tenant=tenant, run_id=run.id if run else None, target=target)

    def _refuse(self, action: Action, why: str, *, tenant: str | None,
                run_id: str | None = None, target: str | None = None) -> NoReturn:
        """Record the refused attempt (its own transaction: nothing else is
        written), then raise ``PermissionDeniedError``."""
        self.rt.store.append_audit(AuditEntry(
            principal=self.principal.id, tenant=tenant, action=action, outcome="refused",
            run_id=run_id, target=target, reason=why,
            changes={"roles": sorted(self.principal.roles)}), now=self.rt.clock.now())
        raise PermissionDeniedError(f"{self.principal.id} may not {action}"
                                    + (f" run {run_id}" if run_id else "") + f": {why}")

    def _own_tenant(self) -> str | None:
        return None if self.principal.all_tenants else self.principal.tenant

    @contextmanager
    def _recorded(self, action: Action, run: RunRecord | None, *, target: str | None = None,
                  reason: str | None = None, changes: dict[str, Any] | None = None,
                  tenant: str | None = None) -> Iterator[None]:
        """Append the action's audit entry in the transaction that does it."""
        entry = AuditEntry(principal=self.principal.id,
                           tenant=run.tenant if run is not None else tenant, action=action,
                           run_id=run.id if run is not None else None, target=target,
                           reason=reason, changes=changes)
        with audit.pending(entry, now=self.rt.clock.now()):
            yield

    # --- runs ---------------------------------------------------------------

    def _tenant_of_new_run(self, tenant: str | None) -> str | None:
        """The tenant a new run belongs to: the principal's; an admin across
        tenants names one (or none, as before tenancy)."""
        if tenant is not None:
            check_id(tenant, "tenant")
        if self.principal.all_tenants:
            return tenant
        if tenant in (None, self.principal.tenant):
            return self.principal.tenant
        self._refuse("start", "a principal starts runs in its own tenant only",
                     tenant=self.principal.tenant)

    def _existing(self, run_id: str, tenant: str | None) -> RunRecord | None:
        """The run ``run_id`` if it exists for the caller (a retried start or
        fork returns it); ``RunIdUnavailableError`` if the id is another
        tenant's. ``tenant=None`` from an admin across tenants names none: any
        run it sees is its own retry."""
        run = self.rt.store.get_run(run_id)
        if run is None:
            return None
        self._claimable(run, tenant)
        return run

    def _claimable(self, run: RunRecord, tenant: str | None) -> None:
        if not self.principal.sees(run.tenant) or (
                tenant is not None and run.tenant != tenant):
            raise RunIdUnavailableError(f"run id {run.id!r} is not available; choose another")


__all__ = ["AccessControl", "check_id", "ref", "scoped"]
