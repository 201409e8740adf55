"""The runs page and the run page: filters, counts, tenant isolation, the
failed run's error and lap, escaping, paging."""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.testclient import TestClient

from agent_worker.console.app import create_app
from agent_worker.console.users import UserBook
from agent_worker.inprocess import InProcessWorker
from tests.console.agents import HOSTILE, REFUSAL
from tests.console.conftest import PASSWORD, csrf_of, started


def test_runs_page_counts_filters_and_tenant_isolation(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    waiting = started(worker, "refunds", labels={"customer": "c-9"})
    failed = started(worker, "console-fails")
    theirs = started(worker, "console-fails", tenant="globex")
    alice = login("alice")
    page = alice.get("/runs").text
    assert re.search(r'data-status="waiting" href="[^"]*">waiting <span class="n">1<', page)
    assert re.search(r'data-status="failed" href="[^"]*">failed <span class="n">1<', page)
    assert waiting in page and failed in page and theirs not in page
    assert 'id="f-tenant"' not in page  # the tenant filter is for admins
    only_failed = alice.get("/runs?failed=1").text
    assert failed in only_failed and waiting not in only_failed
    labelled = alice.get("/runs?labels=customer%3Dc-9").text
    assert waiting in labelled and failed not in labelled
    assert theirs not in alice.get("/runs?tenant=globex").text
    assert alice.get(f"/runs/{theirs}").status_code == 404
    assert alice.get(f"/runs/{theirs}/live").status_code == 404
    assert alice.get("/runs?status=bogus").status_code == 400
    assert alice.get("/runs?sort=bogus").status_code == 400
    assert 'id="no-runs"' in alice.get("/runs?stale=1").text  # nothing is moving
    by_agent = alice.get("/runs?sort=agent").text
    assert by_agent.index(failed) < by_agent.index(waiting)  # "console-fails" before "refunds"
    root = login("root").get("/runs?tenant=globex").text
    assert theirs in root and failed not in root and 'id="f-tenant"' in root


def test_failed_run_page_shows_the_error_and_the_failing_lap(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    failed = started(worker, "console-fails")
    page = login("bob").get(f"/runs/{failed}")
    assert page.status_code == 200
    assert 'id="run-status" data-status="failed"' in page.text
    assert re.search(r'id="failing-lap" data-lap="2">Failing lap: 2<', page.text)
    assert REFUSAL in page.text and 'id="error-detail"' in page.text
    assert 'data-finished="true"' in page.text
    assert ('href="http://flower.test/tasks?name=agent_worker.run_lap%20kwargs%3Arun_id%3D'
            + failed in page.text)


def test_markup_from_tools_renders_as_text(worker: InProcessWorker,
                                           login: Callable[[str], TestClient]) -> None:
    run = started(worker, "refunds")
    page = login("alice").get(f"/runs/{run}").text
    assert HOSTILE not in page and "<script>document" not in page
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page
    assert page.count("<script") == 1  # the console's own script tag only
    assert "scrypt$" not in page and "sqlite:" not in page  # no hash, no store URL
    assert 'data-finished="false"' in page and 'data-live="/runs/' in page


def test_long_runs_are_paged(tmp_path: object, users: UserBook,
                             worker: InProcessWorker) -> None:
    small = worker.rt.settings.model_copy(update={"console_page_size": 2})
    browser = TestClient(create_app(worker, users=users, settings=small),
                         follow_redirects=False)
    form = browser.get("/login")
    browser.post("/login", data={"username": "bob", "password": PASSWORD,
                                 "csrf_token": csrf_of(form.text)})
    run = started(worker, "refunds")  # 2 laps, 4 messages
    first = browser.get(f"/runs/{run}").text
    messages = re.findall(r'data-seq="(\d+)"', first)
    assert messages == ["3", "2"] and 'id="messages-older"' in first
    older = browser.get(f"/runs/{run}?messages=2").text
    assert re.findall(r'data-seq="(\d+)"', older) == ["1", "0"]
    assert re.findall(r'<tr data-lap="(\d+)"', older) == ["2", "1"]


def test_timeline_marks_a_retried_lap(worker: InProcessWorker,
                                      login: Callable[[str], TestClient]) -> None:
    run = started(worker, "flaky")
    page = login("bob").get(f"/runs/{run}").text
    row = re.search(r'<tr data-lap="1"[^>]*>', page)
    assert row is not None and 'data-retried="true"' in row.group(0)
    assert re.search(r'data-kind="retry"', page)
