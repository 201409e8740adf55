"""The run page's budget table, its links (Flower, metrics), the favicon, and
the notice after an approval is decided (issue 49: the table's header, the
deadline row, the lap count, costs without a currency; a Flower link Flower
ignored, a metrics link to nothing, a 404 favicon, an empty notice)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from urllib.parse import unquote, urlsplit

import pytest
from starlette.testclient import TestClient

from agent_worker.agent import Agent
from agent_worker.console.app import create_app
from agent_worker.console.users import UserBook
from agent_worker.console.views import duration, money
from agent_worker.core.budget import Budget
from agent_worker.core.clock import ManualClock
from agent_worker.core.constants import LAP_TASK_NAME
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from tests.console.conftest import PASSWORD, csrf_of, started
from tests.principals import acting


def _browser(worker: InProcessWorker, users: UserBook, user: str, **settings: object
             ) -> TestClient:
    """``user`` logged in to a console with ``settings`` changed."""
    s = worker.rt.settings.model_copy(update=settings)
    browser = TestClient(create_app(worker, users=users, settings=s), follow_redirects=False)
    form = browser.get("/login")
    assert browser.post("/login", data={"username": user, "password": PASSWORD,
                                        "csrf_token": csrf_of(form.text)}).status_code == 303
    return browser


def _row(page: str, name: str) -> str:
    """The text of budget row ``name`` (tags dropped)."""
    found = re.search(rf'<tr data-budget="{name}">(.*?)</tr>', page)
    assert found, f"no budget row {name}"
    return re.sub(r"<[^>]+>", "", found.group(1))


def test_budget_reads_used_against_limit_with_time_and_currency(
        worker: InProcessWorker, users: UserBook) -> None:
    t0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    clock = ManualClock(t0)
    worker.rt.clock = clock
    worker.rt.registry.register(Agent(
        name="priced", model=lambda: ScriptedModel(lambda r: turn("done")),
        prices={"scripted": {"input_per_mtok": "30", "output_per_mtok": "60"}},
        budget=Budget(max_laps=4, max_cost=Decimal("2"), max_wall_seconds=600)))
    run = acting(worker, "app", "submitter", tenant="acme").start_run("priced", "go")
    clock.advance(seconds=90)
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    page = _browser(worker, users, "bob", console_currency="EUR").get(f"/runs/{run.id}").text
    assert ('<thead><tr><th scope="col">Resource</th><th scope="col">Used / limit</th>'
            '</tr></thead>') in page
    assert _row(page, "laps") == "laps1 / 4"
    assert _row(page, "input tokens") == "input tokens100 / no limit"
    # 100 tokens in at 30 a million, 20 out at 60: 0.0042, not "0.004200"
    assert _row(page, "cost") == "cost0.0042 EUR / 2.00 EUR"
    assert re.search(r'id="run-cost">0.0042 EUR<', page)
    # time used (start to finish) against the time given, not the creation time
    assert _row(page, "deadline") == "deadline1m 30s / 10m 00s (until 2026-03-01 09:10:00 UTC)"
    assert "2026-03-01 09:00:00" not in _row(page, "deadline")


def test_laps_charged_and_laps_committed_agree(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run = started(worker, "refunds")
    approval = worker.list_approvals(run_id=run)[0]
    acting(worker, "alice", "approver", tenant="acme").approve(approval.id)
    worker.run_until_idle()
    record = worker.get_run(run)
    assert (record.lap, record.laps_used) == (4, 3)  # the lap after the approval ran the call
    page = login("bob").get(f"/runs/{run}").text
    assert re.search(r'id="run-laps">4 \(3 charged to the budget\)<', page)
    assert _row(page, "laps").startswith("laps3 / 200 (of 4 committed")


def test_flower_link_is_a_search_flower_applies(
        worker: InProcessWorker, login: Callable[[str], TestClient]) -> None:
    run = started(worker, "console-fails")
    page = login("bob").get(f"/runs/{run}").text
    found = re.search(r'id="flower-run" href="([^"]+)"', page)
    assert found
    href = found.group(1).replace("&amp;", "&")
    parts = urlsplit(href)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "http://flower.test/tasks"
    # What Flower 2.2's tasks page puts in its search box: ``key:value`` for each
    # of state, worker and name, read by a regex and decodeURIComponent ("+" stays).
    box = " ".join(
        f"{key}:{unquote(m.group(1))}" for key in ("state", "worker", "name")
        if (m := re.search(rf"[?&]{key}=([^&#]*)", href)))
    assert box == f"name:{LAP_TASK_NAME} kwargs:run_id={run}"
    search = pytest.importorskip("flower.utils.search")
    engine = search.TaskSearchEngine()

    def task(uuid: str, name: str, kwargs: dict[str, object]) -> tuple[str, SimpleNamespace]:
        return uuid, SimpleNamespace(uuid=uuid, name=name, state="SUCCESS", worker=None,
                                     args="()", kwargs=repr(kwargs), result=None)

    engine.rebuild([task("a", LAP_TASK_NAME, {"run_id": run, "lap": 1}),
                    task("b", LAP_TASK_NAME, {"run_id": run, "lap": 2}),
                    task("c", LAP_TASK_NAME, {"run_id": "other", "lap": 1}),
                    task("d", "agent_worker.sweep", {})])
    assert engine.matching_ids(box) == {"a", "b"}


def test_metrics_link_only_when_a_metrics_url_is_set(
        worker: InProcessWorker, users: UserBook,
        login: Callable[[str], TestClient]) -> None:
    assert worker.rt.settings.console_metrics_url == ""
    runs = login("bob").get("/runs").text
    assert 'id="nav-metrics"' not in runs and 'id="nav-flower"' in runs
    configured = _browser(worker, users, "bob",
                          console_metrics_url="http://metrics.test:9100/metrics")
    assert ('<a id="nav-metrics" href="http://metrics.test:9100/metrics">Metrics</a>'
            in configured.get("/runs").text)


def test_favicon_is_served_from_the_console(app_client: Callable[[], TestClient]) -> None:
    browser = app_client()  # nobody logged in: a login page asks for it too
    ico = browser.get("/favicon.ico")
    assert ico.status_code == 200 and ico.headers["content-type"] == "image/x-icon"
    assert ico.content[:4] == b"\x00\x00\x01\x00"  # an icon resource
    login_page = browser.get("/login").text
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in login_page
    svg = browser.get("/static/favicon.svg")
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert "img-src 'self'" in svg.headers["content-security-policy"]


def test_rejecting_says_rejected(worker: InProcessWorker,
                                 login: Callable[[str], TestClient]) -> None:
    run = started(worker, "refunds")
    approval = worker.list_approvals(run_id=run)[0]
    alice = login("alice")
    inbox = alice.get("/approvals").text
    done = alice.post(f"/approvals/{approval.id}/decide",
                      data={"csrf_token": csrf_of(inbox), "decision": "reject"})
    assert done.status_code == 303 and done.headers["location"] == "/approvals?done=rejected"
    assert '<p id="notice" role="status">Rejected.</p>' in alice.get(done.headers["location"]).text
    assert 'id="notice"' not in alice.get("/approvals?done=bogus").text  # no empty notice


def test_money_and_duration_text() -> None:
    assert money(Decimal("0.000000"), "USD") == "0.00 USD"
    assert money(Decimal("0.0425"), "USD") == "0.0425 USD"
    assert money(Decimal("0.5"), "USD") == "0.50 USD"
    assert money(Decimal("0.00001"), "USD") == "<0.0001 USD"
    assert money("1234.567", "GBP") == "1,234.57 GBP"
    assert [duration(s) for s in (0, 59, 61, 3600, 90000)] == [
        "0s", "59s", "1m 01s", "1h 00m", "1d 1h"]
