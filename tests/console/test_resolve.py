"""Resolving an effect left ``unknown`` through the console: the operator says
whether the charge landed on a confirmation page, the run goes on accordingly,
and the audit trail and the run's events name who decided. A forged POST from
someone whose roles do not allow it is a 403; another tenant's effect is a 404."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from starlette.testclient import TestClient

from agent_worker.inprocess import InProcessWorker
from tests.console.conftest import csrf_of, started


def _confirmed(olga: TestClient, run_id: str, key: str) -> str:
    """The CSRF token of the resolve confirmation reached from the ledger's link."""
    page = olga.get(f"/runs/{run_id}").text
    assert f'data-effect-key="{key}" data-effect-status="unknown"' in page
    link = f"/runs/{run_id}/actions/resolve?key={key.replace(':', '%3A')}"
    assert f'href="{link}"' in page
    confirm = olga.get(link)
    assert confirm.status_code == 200
    assert f'<option value="{key}" selected>' in confirm.text
    assert "the tool is not called again" in confirm.text
    return csrf_of(confirm.text)


@pytest.mark.parametrize("landed", [True, False])
def test_operator_resolves_an_unknown_charge_and_the_trail_names_her(
        worker: InProcessWorker, login: Callable[[str], TestClient], landed: bool) -> None:
    run_id = started(worker, "charges")
    [effect] = worker.effects(run_id)
    assert effect.status == "unknown"
    olga = login("olga")
    given = {"charged": 700, "seen": "in the card network's dashboard"}
    done = olga.post(f"/runs/{run_id}/actions/resolve", data={
        "csrf_token": _confirmed(olga, run_id, effect.key), "key": effect.key,
        "applied": "yes" if landed else "no", "result": json.dumps(given)})
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run_id}?done=resolve"
    worker.run_until_idle()
    assert worker.get_run(run_id).status == "succeeded"
    [after] = worker.effects(run_id)
    # Applied: the human's result stands in for the call; not applied: the
    # tool was called again with the same key and its own answer is kept.
    expected = given if landed else {"charged": 700, "order": "9"}
    assert (after.status, after.result) == ("applied", expected)
    [entry] = worker.audit(principal="olga", action="resolve")
    assert (entry.outcome, entry.run_id, entry.target) == ("ok", run_id, effect.key)
    assert entry.changes is not None and entry.changes["applied"] is landed
    page = olga.get(f"/runs/{run_id}?done=resolve").text
    assert "Effect resolved." in page and 'data-kind="effect_resolved"' in page
    assert "&#34;by&#34;: &#34;olga&#34;" in page  # the event names the principal


def test_a_forged_resolve_is_refused_and_another_tenants_effect_is_not_found(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run_id = started(worker, "charges")
    [effect] = worker.effects(run_id)
    form = {"key": effect.key, "applied": "yes", "result": "{}"}
    alice = login("alice")  # an approver of acme: may read the run, not resolve
    assert 'id="action-resolve"' not in alice.get(f"/runs/{run_id}").text
    token = csrf_of(alice.get(f"/runs/{run_id}").text)
    refused = alice.post(f"/runs/{run_id}/actions/resolve", data={**form, "csrf_token": token})
    assert refused.status_code == 403 and 'data-code="permission_denied"' in refused.text
    [audited] = worker.audit(principal="alice", action="resolve")
    assert (audited.outcome, audited.target) == ("refused", effect.key)
    gus = login("gus")  # an operator, of globex: acme's run does not exist for him
    token = csrf_of(gus.get("/runs").text)
    assert gus.get(f"/runs/{run_id}/actions/resolve").status_code == 404
    unknown = gus.post(f"/runs/{run_id}/actions/resolve", data={**form, "csrf_token": token})
    assert unknown.status_code == 404
    own = started(worker, "charges", tenant="globex")  # his own run, acme's key
    smuggled = gus.post(f"/runs/{own}/actions/resolve", data={**form, "csrf_token": token})
    assert smuggled.status_code == 404
    assert worker.effects(run_id)[0].status == "unknown"
    assert not worker.audit(principal="gus", action="resolve")
