"""The decision verbs still take the ``by=`` they lost to the handle's
principal, for one minor version: the
argument is ignored with a ``DeprecationWarning`` that names the replacement
and points at the caller's line, and the record says who from the principal.
On both dialects, through the handle's methods and the module-level verbs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import agent_worker
import agent_worker.api as api
from agent_worker import InProcessWorker, ScriptedModel, ToolContext, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.errors import AgentWorkerError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.store.sql import SqlStore
from tests.principals import acting

#: The warning's text: the argument, and what replaced it.
WARNS = r"\(by=\.\.\.\) is deprecated and ignored.*client's principal.*connect\(principal\)"


@tool(kind="idempotent", approval=True)
def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order; a human approves every call."""
    return {"refunded": order}


def _script(r: ModelRequest) -> ModelResponse:
    return turn("refunding", [("refund", {"order": "o-1"})]) if r.lap == 1 else turn("done")


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(name="refunder", model=ScriptedModel(_script),
                                      tools=[refund], approval_timeout=timedelta(hours=1)))
    yield worker
    api.configure(None)
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def _waiting(w: InProcessWorker) -> str:
    """A run waiting for a human to approve its refund."""
    run = w.start_run("refunder", "go")
    w.run_until_idle()
    assert w.get_run(run.id).status == "waiting"
    return run.id


def _method(w: InProcessWorker, verb: str) -> Callable[..., Any]:
    handle = acting(w, "ops@x")
    return getattr(handle, verb)  # type: ignore[no-any-return]


def _module_level(w: InProcessWorker, verb: str) -> Callable[..., Any]:
    api.configure(acting(w, "ops@x"))
    return getattr(agent_worker, verb)  # type: ignore[no-any-return]


@pytest.mark.parametrize("through", [_method, _module_level], ids=["handle", "module"])
@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_a_decision_given_by_is_recorded_as_the_principal(
        w: InProcessWorker, verb: str,
        through: Callable[[InProcessWorker, str], Callable[..., Any]]) -> None:
    run_id = _waiting(w)
    decide = through(w, verb)
    with pytest.warns(DeprecationWarning, match=verb + WARNS) as caught:
        record = decide(run_id, comment="checked", by="mallory")
    assert [x.filename for x in caught] == [__file__]  # the caller's line, not ours
    assert record.status == ("approved" if verb == "approve" else "rejected")
    assert record.decided_by == "ops@x"
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"


@pytest.mark.parametrize("through", [_method, _module_level], ids=["handle", "module"])
def test_a_cancel_given_by_is_recorded_as_the_principal(
        w: InProcessWorker,
        through: Callable[[InProcessWorker, str], Callable[..., Any]]) -> None:
    run_id = _waiting(w)
    cancel = through(w, "cancel")
    with pytest.warns(DeprecationWarning, match="cancel" + WARNS) as caught:
        run = cancel(run_id, reason="not needed", by="mallory")
    assert [x.filename for x in caught] == [__file__]
    assert run.cancelled_by == "ops@x"
    assert run.cancel_reason == "not needed"
    w.run_until_idle()
    assert w.get_run(run_id).status == "cancelled"


def test_without_by_nothing_warns(w: InProcessWorker) -> None:
    """The configuration turns warnings into errors: no ``by``, no warning."""
    run_id = _waiting(w)
    assert acting(w, "ops@x").approve(run_id).decided_by == "ops@x"


@pytest.mark.parametrize(("verb", "extra"), [
    ("retry", {}), ("raise_budget", {"max_laps": 50}), ("resolve_effect", {"applied": True})])
def test_the_other_verbs_take_by_with_the_warning(
        w: InProcessWorker, verb: str, extra: dict[str, Any]) -> None:
    """Accepted (no ``TypeError``) and warned about; whatever the verb then
    says of this run's state is its own answer, not the argument's."""
    run_id = _waiting(w)
    target = f"{run_id}:1:0" if verb == "resolve_effect" else run_id
    with pytest.warns(DeprecationWarning, match=verb + WARNS) as caught, \
            contextlib.suppress(AgentWorkerError):
        getattr(acting(w, "ops@x"), verb)(target, by="mallory", **extra)
    assert [x.filename for x in caught] == [__file__]
