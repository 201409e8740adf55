"""The approvals inbox: who sees the buttons, and a forged decision refused
by the API (not just a hidden button)."""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.testclient import TestClient

from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import csrf_of, started


def _waiting(worker: InProcessWorker) -> tuple[str, str]:
    run_id = started(worker, "refunds")
    return run_id, worker.list_approvals(run_id=run_id)[0].id


def test_approver_sees_reasoning_and_arguments_and_approves(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id, approval_id = _waiting(worker)
    alice = login("alice")
    inbox = alice.get("/approvals").text
    assert f'id="approve-{approval_id}"' in inbox and f'id="reject-{approval_id}"' in inbox
    assert "Refunding the duplicate charge of order 7." in inbox  # the model's reasoning
    assert "money leaves the company" in inbox  # the tool's description
    assert '<label for="comment-' + approval_id + '">' in inbox
    done = alice.post(f"/approvals/{approval_id}/decide", data={
        "csrf_token": csrf_of(inbox), "decision": "approve", "comment": "duplicate, ok",
        "arguments": '{"order_id": "7", "amount_cents": 1200}',
        "original_arguments": '{"amount_cents": 1500, "order_id": "7"}'})
    assert done.status_code == 303 and done.headers["location"] == "/approvals?done=approved"
    decided = worker.list_approvals(status="approved", run_id=run_id)[0]
    assert decided.decided_by == "alice" and decided.comment == "duplicate, ok"
    assert decided.approved_arguments == {"order_id": "7", "amount_cents": 1200}
    worker.run_until_idle()
    assert worker.get_run(run_id).status == "succeeded"
    page = alice.get(f"/runs/{run_id}").text
    assert 'data-finished="true"' in page and "&#34;amount_cents&#34;: 1200" in page


def test_non_approver_sees_no_button_and_a_forged_post_is_refused(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id, approval_id = _waiting(worker)
    bob = login("bob")
    inbox = bob.get("/approvals").text
    assert f'data-approval-id="{approval_id}"' in inbox  # listed, read-only
    assert f'id="approve-{approval_id}"' not in inbox and "<form class=\"decide\"" not in inbox
    forged = bob.post(f"/approvals/{approval_id}/decide",
                      data={"csrf_token": csrf_of(inbox), "decision": "approve"})
    assert forged.status_code == 403 and 'data-code="permission_denied"' in forged.text
    assert worker.list_approvals(run_id=run_id)[0].status == "pending"
    refused = worker.audit(principal="bob")
    assert refused and refused[0].outcome == "refused" and refused[0].action == "approve"
    eve = login("eve")  # an approver of another tenant: the approval does not exist for her
    assert approval_id not in eve.get("/approvals").text
    assert eve.post(f"/approvals/{approval_id}/decide", data={
        "csrf_token": csrf_of(eve.get("/runs").text), "decision": "approve"}
    ).status_code == 404


def test_decision_without_the_session_token_is_refused(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id, approval_id = _waiting(worker)
    alice = login("alice")
    for token in (None, "forged", csrf_of(login("olga").get("/runs").text)):
        data = {"decision": "approve"} | ({"csrf_token": token} if token else {})
        refused = alice.post(f"/approvals/{approval_id}/decide", data=data)
        assert refused.status_code == 403 and 'data-code="csrf_refused"' in refused.text
    assert worker.list_approvals(run_id=run_id)[0].status == "pending"
    rejected = alice.post(f"/approvals/{approval_id}/decide", data={
        "csrf_token": csrf_of(alice.get("/approvals").text), "decision": "reject",
        "comment": "not a duplicate"})
    assert rejected.status_code == 303
    assert worker.list_approvals(status="rejected", run_id=run_id)[0].comment == (
        "not a duplicate")
    assert re.search(r'id="inbox-empty"', alice.get("/approvals").text)
