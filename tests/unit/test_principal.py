"""Principals and the built-in role authorizer, and an
application's own authorizer plugged into a client (in-process, SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_worker.agent import Agent, register
from agent_worker.core.authorization import DEFAULT_GRANTS, AccessRequest, RoleAuthorizer
from agent_worker.core.errors import InvalidInputError, PermissionDeniedError
from agent_worker.core.principal import Principal, default_principal
from agent_worker.core.settings import Settings
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn

register(Agent(name="principal-echo", model=lambda: ScriptedModel(lambda r: turn("hi"))))


def test_a_principal_is_validated_and_frozen() -> None:
    p = Principal("alice", "acme", ["approver"])
    assert p.roles == frozenset({"approver"}) and p.sees("acme") and not p.sees("globex")
    assert not p.sees(None) and p.member_of("approver") and p.member_of("alice")
    with pytest.raises(AttributeError):
        p.tenant = "globex"  # type: ignore[misc]
    with pytest.raises(InvalidInputError, match="admin"):
        Principal("eve", "*", {"operator"})
    with pytest.raises(InvalidInputError):
        Principal("eve", "acme\n")
    with pytest.raises(InvalidInputError):
        Principal("eve", "acme", "operator")  # one string, not a set of roles
    with pytest.raises(InvalidInputError):
        Principal("  ", "acme")
    assert Principal("root", "*", {"admin"}).sees("anything")


def test_the_default_principal_is_a_single_tenant_admin_from_settings() -> None:
    p = default_principal(Settings())
    assert p.tenant == "*" and p.roles == {"admin"} and p.id.startswith("local:")
    named = default_principal(Settings(principal_id="ops-bot", principal_tenant="acme",
                                       principal_roles="operator, acme-ops"))
    assert named == Principal("ops-bot", "acme", {"operator", "acme-ops"})


def test_roles_grant_actions_and_owners_decide() -> None:
    authorize = RoleAuthorizer(DEFAULT_GRANTS)
    submitter = Principal("s", "acme", {"submitter"})
    approver = Principal("a", "acme", {"approver", "acme-ops"})
    outsider = Principal("o", "acme", {"approver"})
    assert authorize(submitter, AccessRequest("start", "acme"))
    assert not authorize(submitter, AccessRequest("retry", "acme", "r1"))
    assert not authorize(submitter, AccessRequest("approve", "acme", "r1"))
    assert authorize(approver, AccessRequest("approve", "acme", "r1", ("acme-ops",)))
    assert not authorize(outsider, AccessRequest("approve", "acme", "r1", ("acme-ops",)))
    assert authorize(outsider, AccessRequest("approve", "acme", "r1"))  # no owner named
    assert authorize(Principal("root", "acme", {"admin"}),
                     AccessRequest("approve", "acme", "r1", ("acme-ops",)))
    with pytest.raises(InvalidInputError, match="unknown actions"):
        RoleAuthorizer({"auditor": ["read", "delete_everything"]})


def test_an_applications_authorizer_decides_and_its_refusals_are_audited(
        tmp_path: Path) -> None:
    w = InProcessWorker(f"sqlite:///{tmp_path / 'aw.db'}")
    try:
        asked: list[AccessRequest] = []

        def only_reads(p: Principal, r: AccessRequest) -> bool:
            asked.append(r)
            return r.action == "read"

        bob = w.acting_as(Principal("bob", "acme", {"admin"}), authorizer=only_reads)
        with pytest.raises(PermissionDeniedError):
            bob.start_run("principal-echo")
        assert bob.list_runs() == [] and [r.action for r in asked] == ["start", "read"]
        entries = w.audit()
        assert [(e.principal, e.tenant, e.action, e.outcome) for e in entries] == [
            ("bob", "acme", "start", "refused")]
        short = InProcessWorker(f"sqlite:///{tmp_path / 'aw.db'}", max_principal_chars=13,
                                principal_id="ops")
        try:
            with pytest.raises(InvalidInputError, match="limit is 13"):
                short.acting_as(Principal("carol-the-long", "acme"))
        finally:
            short.close()
    finally:
        w.close()
