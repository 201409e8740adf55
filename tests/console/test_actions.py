"""Actions on a run: confirmation pages that say what happens to the world,
shown and allowed by role."""

from __future__ import annotations

from collections.abc import Callable

from starlette.testclient import TestClient

from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import csrf_of, started


def test_operator_retries_a_failed_run_after_a_confirmation(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "console-fails")
    olga = login("olga")
    page = olga.get(f"/runs/{run_id}").text
    assert 'id="action-retry"' in page and 'id="action-fork"' in page
    confirm = olga.get(f"/runs/{run_id}/actions/retry")
    assert confirm.status_code == 200 and "replays lap 2" in confirm.text
    assert "not sent again" in confirm.text
    done = olga.post(f"/runs/{run_id}/actions/retry", data={"csrf_token": csrf_of(confirm.text)})
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run_id}?done=retry"
    assert worker.get_run(run_id).status == "queued"
    assert worker.audit(principal="olga", action="retry")


def test_roles_decide_the_buttons_and_the_api_refuses_the_rest(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "refunds")
    alice = login("alice")  # approver: reads and decides, no run verbs
    assert 'id="run-actions"' not in alice.get(f"/runs/{run_id}").text
    bob = login("bob")  # submitter: cancel and signal, not retry
    page = bob.get(f"/runs/{run_id}").text
    assert 'id="action-cancel"' in page and 'id="action-retry"' not in page
    refused = bob.post(f"/runs/{run_id}/actions/retry", data={"csrf_token": csrf_of(page)})
    assert refused.status_code == 403
    confirm = bob.get(f"/runs/{run_id}/actions/cancel").text
    assert "compensatable" in confirm and '<label for="reason">' in confirm
    done = bob.post(f"/runs/{run_id}/actions/cancel",
                    data={"csrf_token": csrf_of(confirm), "reason": "customer withdrew"})
    assert done.status_code == 303
    assert worker.get_run(run_id).cancel_reason == "customer withdrew"
    assert bob.get(f"/runs/{run_id}/actions/explode").status_code == 404


def test_fork_and_signal_through_their_confirmations(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "refunds")
    olga = login("olga")
    confirm = olga.get(f"/runs/{run_id}/actions/fork").text
    assert "acts on the world again" in confirm and '<label for="fork-lap">' in confirm
    forked = olga.post(f"/runs/{run_id}/actions/fork", data={
        "csrf_token": csrf_of(confirm), "lap": "1", "new_run_id": "fork-of-refund"})
    assert forked.headers["location"] == "/runs/fork-of-refund?done=fork"
    page = olga.get("/runs/fork-of-refund?done=fork").text
    assert "Forked: this is the new run." in page and f'href="/runs/{run_id}"' in page
    bad = olga.post(f"/runs/{run_id}/actions/fork", data={"csrf_token": csrf_of(page),
                                                          "lap": "one"})
    assert bad.status_code == 400
    signal = olga.post(f"/runs/{run_id}/actions/signal", data={
        "csrf_token": csrf_of(page), "name": "nudge", "payload": '{"why": "<b>now</b>"}'})
    assert signal.status_code == 303
    live = olga.get(f"/runs/{run_id}/live").text
    assert live.lstrip().startswith('<div id="run-body"') and "<html" not in live


def test_hostile_form_json_is_a_refusal_page_not_a_crash(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    """A form field is anyone's bytes: nesting past the JSON parser's own limit
    gets the 400 page and nothing is sent; U+0000 and a lone surrogate follow
    the one rule of ``agent_worker.core.untrusted`` (stored as U+FFFD), as through
    the API."""
    run_id = started(worker, "refunds")
    olga = login("olga")
    before = [e.kind for e in worker.events(run_id)]
    token = csrf_of(olga.get(f"/runs/{run_id}/actions/signal").text)
    refused = olga.post(f"/runs/{run_id}/actions/signal", data={
        "csrf_token": token, "name": "nudge", "payload": "[" * 100_000 + "]" * 100_000})
    assert refused.status_code == 400 and "nests too deeply" in refused.text
    assert [e.kind for e in worker.events(run_id)] == before
    assert not worker.audit(principal="olga", action="signal")
    sent = olga.post(f"/runs/{run_id}/actions/signal", data={
        "csrf_token": token, "name": "nudge", "payload": '{"note": "a\\u0000b\\ud800"}'})
    assert sent.status_code == 303
    assert len(worker.audit(principal="olga", action="signal")) == 1


def test_operator_raises_a_paused_budget_and_the_run_resumes(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "console-budget")
    paused = worker.get_run(run_id)
    assert paused.status == "waiting" and paused.waiting_for == "budget"
    bob = login("bob")  # a submitter may not lift limits: no link, and the API refuses
    page = bob.get(f"/runs/{run_id}").text
    assert 'id="raise-budget"' not in page
    refused = bob.post(f"/runs/{run_id}/actions/raise_budget",
                       data={"csrf_token": csrf_of(page), "max_laps": "5"})
    assert refused.status_code == 403
    olga = login("olga")
    page = olga.get(f"/runs/{run_id}").text
    assert 'id="raise-budget"' in page and 'id="action-raise_budget"' in page
    confirm = olga.get(f"/runs/{run_id}/actions/raise_budget").text
    assert '<label for="max-laps">' in confirm and "audit log" in confirm
    forged = olga.post(f"/runs/{run_id}/actions/raise_budget", data={"max_laps": "5"})
    assert forged.status_code == 403 and 'data-code="csrf_refused"' in forged.text
    blank = olga.post(f"/runs/{run_id}/actions/raise_budget",
                      data={"csrf_token": csrf_of(confirm)})
    assert blank.status_code == 400
    negative = olga.post(f"/runs/{run_id}/actions/raise_budget",
                         data={"csrf_token": csrf_of(confirm), "max_laps": "-1"})
    assert negative.status_code == 400
    done = olga.post(f"/runs/{run_id}/actions/raise_budget",
                     data={"csrf_token": csrf_of(confirm), "max_laps": "5", "max_cost": ""})
    assert done.status_code == 303
    assert done.headers["location"] == f"/runs/{run_id}?done=raise_budget"
    assert worker.get_run(run_id).limits["max_laps"] == 5
    (entry,) = worker.audit(principal="olga", action="raise_budget")
    assert entry.run_id == run_id
    worker.run_until_idle()
    assert worker.get_run(run_id).status == "succeeded"
    after = olga.get(f"/runs/{run_id}?done=raise_budget").text
    assert "Budget raised: the run resumes." in after and 'id="raise-budget"' not in after
    assert olga.get(f"/runs/{run_id}/actions/raise_budget").status_code == 409
