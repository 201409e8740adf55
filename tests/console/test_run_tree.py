"""The run page's tree and decisions: a parent's children and grandchildren
with their statuses, linked, counted past what a level lists; a child's page
links its parent; the approval history stays on the page after the decision
(who, when, the comment, the arguments the approver changed)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from starlette.testclient import TestClient

import tests.child_agents  # noqa: F401  (registers "fan" and "kid" in the global registry)
from agent_worker.agent import Agent
from agent_worker.agent import registry as global_agents
from agent_worker.children import Child, StartChildren
from agent_worker.console.tree import AXIS_PX
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool
from tests.console.conftest import started
from tests.principals import acting


@tool(kind="idempotent")
def spawn_fans(n: int, ctx: ToolContext) -> StartChildren:
    """Start ``n`` fans of two kids each, and wait for them."""
    return ctx.start_children([Child(agent="fan", input={"n": 2}) for _ in range(n)])


def _grand(r: ModelRequest) -> ModelResponse:
    if r.messages[-1].role == "tool":
        return turn("all fans done")
    return turn("fanning out", [("spawn_fans", {"n": 2})])


def _with_families(worker: InProcessWorker) -> None:
    for name in ("fan", "kid"):
        found = global_agents.resolve(name, "1")
        assert found is not None
        worker.rt.registry.register(found)
    worker.rt.registry.register(Agent(name="grand", model=lambda: ScriptedModel(_grand),
                                      tools=[spawn_fans], window_messages=2000))


def test_a_fan_out_of_ten_shows_each_child_with_its_status(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    _with_families(worker)
    run = acting(worker, "app", "submitter", tenant="acme").start_run("fan", {"n": 10})
    worker.run_until_idle()
    kids = {r.id: r.status for r in worker.list_runs(parent=run.id)}
    assert len(kids) == 10
    bob = login("bob")
    page = bob.get(f"/runs/{run.id}").text
    listed = dict(re.findall(r'<li data-run-id="([^"]+)" data-status="(\w+)"><a href="/runs/\1">',
                             page))
    assert listed == kids
    assert 'id="children" data-total="10"' in page and "10 succeeded" in page
    # Each child's bar on one axis from the parent's start to the last child's end.
    bars = re.findall(r'<rect x="([\d.]+)" width="([\d.]+)" height="10" fill="#2f9e6a">', page)
    assert len(bars) == 10
    assert max(float(x) + float(w) for x, w in bars) == pytest.approx(AXIS_PX, abs=1.5)
    child = bob.get(f"/runs/{next(iter(kids))}").text
    assert re.search(rf'id="parent">Parent: <a href="/runs/{run.id}">', child)
    assert 'data-status="succeeded"' in child.split('id="parent"')[1].split("</p>")[0]


def test_grandchildren_hang_under_their_parents(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    _with_families(worker)
    run = acting(worker, "app", "submitter", tenant="acme").start_run("grand", "go")
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    fans = worker.list_runs(parent=run.id)
    page = login("bob").get(f"/runs/{run.id}").text
    tree = page.split('id="children"')[1].split("</section>")[0]
    for fan in fans:
        kids = worker.list_runs(parent=fan.id)
        assert len(kids) == 2
        # The fan's own item, up to the end of its nested list.
        item = tree.split(f'<li data-run-id="{fan.id}"')[1].split("</li></ul>")[0]
        assert "<ul>" in item
        for kid in kids:
            assert f'<li data-run-id="{kid.id}" data-status="succeeded">' in item
    assert 'id="no-children"' in login("bob").get(f"/runs/{kids[0].id}").text


def test_the_decision_stays_on_the_page_with_the_edited_arguments(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "refunds")
    alice = login("alice")
    waiting = alice.get(f"/runs/{run_id}").text
    (pending,) = worker.list_approvals(run_id=run_id)
    assert f'id="waited-approval" href="/approvals#approval-{pending.id}"' in waiting
    acting(worker, "alice", "approver", tenant="acme").approve(
        pending.id, comment="half of it, <b>agreed</b> by phone",
        arguments={"order_id": "7", "amount_cents": 750})
    worker.run_until_idle()
    page = alice.get(f"/runs/{run_id}").text
    row = page.split(f'data-approval-id="{pending.id}"')[1].split("</tr>")[0]
    assert 'data-approval-status="approved"' in row
    assert '<td class="decider">alice</td>' in row
    assert "half of it, &lt;b&gt;agreed&lt;/b&gt; by phone" in row
    assert ('<li data-argument="amount_cents"><code>amount_cents</code>: <del>1500</del> → '
            '<ins>750</ins></li>') in row
    assert "order_id" not in row.split('class="diff"')[1]  # unchanged arguments are not listed
    assert 'id="waited-approval"' not in page


def test_past_twenty_children_a_level_the_rest_are_counted(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    _with_families(worker)
    run = acting(worker, "app", "submitter", tenant="acme").start_run("fan", {"n": 23})
    worker.run_until_idle()
    page = login("bob").get(f"/runs/{run.id}").text
    tree = page.split('id="children"')[1].split("</section>")[0]
    assert tree.count("<li data-run-id=") == 20
    assert '<li class="more">… 3 more (23 in all: 23 succeeded)</li>' in tree
