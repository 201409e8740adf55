"""Labels and search, and approvals with edited arguments, in process on
SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from agent_worker import InProcessWorker, ScriptedModel, ToolContext, tool, turn
from agent_worker.agent import Agent, Registry
from agent_worker.core.errors import InvalidInputError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.store.sql import SqlStore
from tests.principals import acting

#: What the vendor saw: (idempotency key, amount). It dedups on the key.
VENDOR: list[tuple[str, int]] = []
DIE_ONCE = {"left": 0}


@tool(kind="irreversible")
def wire(account: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money; a human approves every call."""
    VENDOR.append((ctx.idempotency_key, amount_cents))
    return {"wired": amount_cents}


@tool(kind="idempotent", approval=True)
def refund(order: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund (keyed at the vendor); the worker may die after the vendor took it."""
    VENDOR.append((ctx.idempotency_key, amount_cents))
    if DIE_ONCE["left"]:
        DIE_ONCE["left"] -= 1
        raise RuntimeError("worker died before recording the outcome")
    return {"refunded": amount_cents}


def _script(name: str, args: dict[str, Any]) -> Any:
    def script(r: ModelRequest) -> ModelResponse:
        return turn("calling", [(name, args)]) if r.lap == 1 else turn("done")
    return script


@pytest.fixture
def w(dialect_url: str) -> Iterator[InProcessWorker]:
    VENDOR.clear()
    DIE_ONCE["left"] = 0
    worker = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3)
    worker.rt.registry = Registry()
    worker.rt.registry.register(Agent(
        name="wirer", model=ScriptedModel(_script("wire", {"account": "a-1",
                                                            "amount_cents": 12500})),
        tools=[wire], approval_timeout=timedelta(hours=1)))
    worker.rt.registry.register(Agent(
        name="refunder", model=ScriptedModel(_script("refund", {"order": "o-1",
                                                                 "amount_cents": 900})),
        tools=[refund], approval_timeout=timedelta(hours=1)))
    worker.rt.registry.register(Agent(name="idle", model=ScriptedModel(
        lambda r: turn("done"))))
    yield worker
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    store.dispose()


def _waiting(w: InProcessWorker, agent: str) -> str:
    run = w.start_run(agent, "go")
    w.run_until_idle()
    assert w.get_run(run.id).status == "waiting"
    return run.id


def test_an_edited_approval_runs_the_new_arguments_once(w: InProcessWorker) -> None:
    run_id = _waiting(w, "wirer")
    with pytest.raises(InvalidInputError, match="amount_cents"):
        acting(w, "ops@x").approve(run_id, arguments={"account": "a-1", "amount_cents": "lots"})
    with pytest.raises(InvalidInputError, match="Extra inputs"):
        acting(w, "ops@x").approve(run_id, arguments={"account": "a-1", "amount_cents": 1, "x": 1})
    assert w.list_approvals(run_id=run_id)[0].status == "pending", "a refused edit decides nothing"
    decided = acting(w, "ops@x").approve(run_id, arguments={"account": "a-1", "amount_cents": 500})
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    key = f"{run_id}:1:0"
    assert [(key, 500)] == VENDOR
    assert (decided.arguments["amount_cents"], decided.approved_arguments) == (
        12500, {"account": "a-1", "amount_cents": 500})
    assert decided.decided_by == "ops@x"
    (effect,) = w.effects(run_id)
    assert (effect.key, effect.args["amount_cents"], effect.status) == (key, 500, "applied")
    event = next(e for e in w.events(run_id) if e.kind == "approval_decided")
    assert event.data is not None and event.data["arguments"] == {
        "original": {"account": "a-1", "amount_cents": 12500},
        "approved": {"account": "a-1", "amount_cents": 500}}
    result = next(m.message.content for m in w.messages(run_id) if m.message.role == "tool")
    assert "changed its arguments to" in result and '"amount_cents": 500' in result


def test_a_replayed_lap_uses_the_approved_arguments(w: InProcessWorker) -> None:
    run_id = _waiting(w, "refunder")
    acting(w, "ops@x").approve(run_id, arguments={"order": "o-1", "amount_cents": 300})
    DIE_ONCE["left"] = 1  # the intent is pending when the attempt dies: replay re-calls
    w.run_until_idle()
    assert w.get_run(run_id).status == "succeeded"
    key = f"{run_id}:1:0"
    assert [(key, 300), (key, 300)] == VENDOR, "same key, same approved arguments"
    (effect,) = w.effects(run_id)
    assert (effect.args["amount_cents"], effect.status, effect.attempts) == (300, "applied", 2)


def test_labels_are_validated_and_searchable_page_by_page(w: InProcessWorker) -> None:
    ids = [w.start_run("idle", "go", labels={"customer": f"acme-{i % 2}", "queue": "vip"},
                       tenant="t-labels").id for i in range(5)]
    w.start_run("wirer", "go", tenant="t-labels", labels={"customer": "acme-0"})
    page = w.search_runs(labels={"customer": "acme-0", "queue": "vip"}, limit=2)
    assert [r.id for r in page.runs] == [ids[4], ids[2]] and page.next_cursor
    rest = w.search_runs(labels={"customer": "acme-0", "queue": "vip"}, limit=2,
                         cursor=page.next_cursor)
    assert [r.id for r in rest.runs] == [ids[0]] and rest.next_cursor is None
    assert rest.runs[0].labels == {"customer": "acme-0", "queue": "vip"}
    assert len(w.search_runs(labels={"customer": "acme-0"}, tenant="t-labels").runs) == 4
    assert len(w.search_runs(labels={"customer": "acme-0"}, agent="wirer").runs) == 1
    first = w.get_run(ids[0]).created_at
    assert {r.id for r in w.search_runs(tenant="t-labels", created_after=first,
                                        created_before=w.get_run(ids[2]).created_at).runs
            } == set(ids[:2])
    assert w.search_runs(labels={"customer": "nobody"}).runs == []
    w.run_until_idle()
    assert len(w.search_runs(labels={"queue": "vip"}, status="succeeded",
                             tenant="t-labels").runs) == 5
    bads: tuple[dict[str, Any], ...] = (
        {"bad key": "x"}, {"k": "line\nbreak"}, {"k": "nul\x00"}, {"k": ""}, {"k": 5},
        {f"k{i}": "v" for i in range(17)}, {"k": "x" * 101})
    for bad in bads:
        with pytest.raises(InvalidInputError):
            w.start_run("idle", "go", labels=bad)
        with pytest.raises(InvalidInputError):
            w.search_runs(labels=bad)
    for cursor in ("garbage", "W10", "", "eyJ4IjoxfQ"):
        with pytest.raises(InvalidInputError, match="cursor"):
            w.search_runs(cursor=cursor)
    with pytest.raises(InvalidInputError, match="limit"):
        w.search_runs(limit=0)
    with pytest.raises(InvalidInputError, match="status"):
        w.search_runs(status="done")  # type: ignore[arg-type]
    assert w.search_runs(tenant="t\x00x").runs == [], "unstorable: matches nothing"
