"""A run page offers only the verbs that can apply to the run as it stands,
and a verb that stopped applying between the page and the POST (the run
finished meanwhile) gets the 409 refusal page, never a 500."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import UTC, datetime

from starlette.testclient import TestClient

from agent_worker.console.applicable import why_not
from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import csrf_of, started
from tests.principals import acting


def offered(browser: TestClient, run_id: str) -> list[str]:
    return re.findall(r'id="action-(\w+)"', browser.get(f"/runs/{run_id}").text)


def test_run_page_offers_only_the_verbs_its_status_allows(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    olga = login("olga")  # an operator: her roles allow every run verb
    for_approval, on_effect = started(worker, "refunds"), started(worker, "charges")
    failed, cancelled = started(worker, "console-fails"), started(worker, "refunds")
    acting(worker, "ops", tenant="acme").cancel(cancelled, reason="test")
    worker.run_until_idle()
    assert worker.get_run(cancelled).status == "cancelled"
    assert offered(olga, for_approval) == ["cancel", "signal", "retry", "fork"]
    assert offered(olga, on_effect) == ["cancel", "signal", "retry", "fork", "resolve"]
    assert offered(olga, failed) == ["retry", "fork"]
    assert offered(olga, cancelled) == ["fork"]
    # The ledger's "resolve…" link only on the effect the run waits on.
    assert "/actions/resolve?key=" not in olga.get(f"/runs/{for_approval}").text
    assert "/actions/resolve?key=" in olga.get(f"/runs/{on_effect}").text
    for verb in ("cancel", "signal", "retry", "resolve"):
        page = olga.get(f"/runs/{cancelled}/actions/{verb}")
        assert page.status_code == 409, (verb, page.text)
        assert f"run {cancelled} is" in page.text and 'id="confirm-form"' not in page.text
        assert f'id="error-back" href="/runs/{cancelled}"' in page.text
    assert olga.get(f"/runs/{cancelled}/actions/fork").status_code == 200


def test_a_run_that_finished_after_the_confirmation_is_refused_with_a_409(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    """The worst interleaving: every confirmation is rendered while the run
    still waits, then the run ends, then the forms are posted. The API decides
    under the run's lock: each POST is refused, and nothing is done."""
    run_id = started(worker, "refunds")
    olga = login("olga")
    forms = {verb: csrf_of(olga.get(f"/runs/{run_id}/actions/{verb}").text)
             for verb in ("cancel", "signal", "retry")}
    acting(worker, "ops", tenant="acme").cancel(run_id, reason="customer withdrew")
    worker.run_until_idle()
    assert worker.get_run(run_id).status == "cancelled"
    events = [e.id for e in worker.events(run_id)]
    for verb, token in forms.items():
        page = olga.post(f"/runs/{run_id}/actions/{verb}", data={
            "csrf_token": token, "reason": "late", "name": "nudge"})
        assert page.status_code == 409, (verb, page.text)
        assert "Not possible now" in page.text and "cancelled" in page.text
        assert f'id="error-back" href="/runs/{run_id}"' in page.text
    assert [e.id for e in worker.events(run_id)] == events
    assert worker.get_run(run_id).cancel_reason == "customer withdrew"


def test_an_effect_resolved_by_someone_else_first_is_refused_with_a_409(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "charges")
    [effect] = worker.effects(run_id)
    olga = login("olga")
    token = csrf_of(olga.get(f"/runs/{run_id}/actions/resolve?key={effect.key}").text)
    acting(worker, "ops", tenant="acme").resolve_effect(effect.key, applied=False)
    late = olga.post(f"/runs/{run_id}/actions/resolve", data={
        "csrf_token": token, "key": effect.key, "applied": "yes", "result": "{}"})
    assert late.status_code == 409 and 'data-code="already_decided"' in late.text
    assert worker.effects(run_id)[0].status != "applied"


def test_a_run_already_being_cancelled_offers_no_second_cancel(
        worker: InProcessWorker) -> None:
    """A lap in flight holds the cancel until its boundary: the run is still
    running, so a signal can still land, but a second cancel would do nothing."""
    run = worker.get_run(started(worker, "refunds"))
    cancelling = dataclasses.replace(run, status="running",
                                     cancel_requested_at=datetime.now(UTC))
    assert why_not("cancel", cancelling) == f"run {run.id} is already being cancelled"
    assert why_not("signal", cancelling) is None and why_not("fork", cancelling) is None
    assert why_not("retry", cancelling) is not None  # running: nothing to retry
