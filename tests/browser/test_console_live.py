"""The console's live pages and search in a real browser (headless Chromium
against ``agent-worker console`` and a real Celery worker): the approvals
badge and the inbox change without a reload when a run starts waiting, and
the run list takes in a new run, both through the console's own stream (the
page says which it uses: ``body[data-live-mode]``); the search box finds a
run by its label; a waiting run in the list links to its approval; no page
logs an error to the browser's console.
"""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import Page, expect

from agent_worker.api import AgentWorker
from tests.browser.server import Cast, ConsoleServer
from tests.browser.test_console_browser import log_in
from tests.support import run_reaching

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.xdist_group("browser")]


def test_the_inbox_and_its_badge_change_without_a_reload_when_a_run_starts_waiting(
        page: Page, console: ConsoleServer, cast: Cast, submitter: AgentWorker,
        errors: list[str]) -> None:
    log_in(page, console, cast.approver, path="/approvals")
    expect(page.locator("body")).to_have_attribute("data-live-mode", "stream")
    badge = page.locator("#approvals-badge")
    expect(badge).to_have_attribute("data-count", re.compile(r"^\d+$"))
    before = int(badge.get_attribute("data-count") or "")
    # Every pending call of this tenant is a gift the approver may decide; the
    # other modules' tenants' calls in the same database are not counted.
    assert before == len(submitter.list_approvals(status="pending"))
    page.evaluate("window.__notReloaded = true")

    run = submitter.start_run("console-gift", {}).id
    run_reaching(submitter, run, "waiting")

    expect(badge).to_have_attribute("data-count", str(before + 1))
    expect(badge).to_be_visible()
    expect(page.locator(f"#approvals-mine article[data-run-id='{run}']")).to_contain_text(
        "send_gift")
    assert page.evaluate("window.__notReloaded") is True


def test_the_run_list_takes_in_a_new_run_and_links_a_waiting_one_to_its_approval(
        page: Page, console: ConsoleServer, cast: Cast, submitter: AgentWorker,
        errors: list[str]) -> None:
    log_in(page, console, cast.approver, path="/runs")
    expect(page.locator("body")).to_have_attribute("data-live-mode", "stream")
    page.evaluate("window.__notReloaded = true")
    run = submitter.start_run("console-gift", {}).id
    run_reaching(submitter, run, "waiting")
    row = page.locator(f"#runs-table tr[data-run-id='{run}']")
    expect(row).to_have_attribute("data-status", "waiting")
    assert page.evaluate("window.__notReloaded") is True
    (approval,) = submitter.list_approvals(status="pending", run_id=run)
    row.locator("a.waiting-approval").click()
    expect(page).to_have_url(f"{console.url}/approvals#approval-{approval.id}")
    expect(page.locator(f"#approval-{approval.id}")).to_be_visible()


def test_search_finds_a_run_by_its_label(page: Page, console: ConsoleServer, cast: Cast,
                                         submitter: AgentWorker, errors: list[str]) -> None:
    order = f"o-{uuid.uuid4().hex[:10]}"
    wanted = submitter.start_run("console-xss", {}, labels={"order": order}).id
    submitter.start_run("console-xss", {}, labels={"order": order + "x"})
    log_in(page, console, cast.operator, path="/runs")
    for term in (f"order={order}", order):
        search = page.get_by_label("Search", exact=True)
        search.fill(term)
        search.press("Enter")
        rows = page.locator("#runs-table tbody tr[data-run-id]")
        expect(rows).to_have_count(1)
        expect(rows).to_have_attribute("data-run-id", wanted)
        expect(rows.locator("td.labels")).to_contain_text(f"order={order}")
        expect(page.get_by_label("Search", exact=True)).to_have_value(term)


def test_no_page_logs_an_error(page: Page, console: ConsoleServer, cast: Cast,
                               submitter: AgentWorker, errors: list[str]) -> None:
    moving = submitter.start_run("console-gift", {}).id
    done = submitter.start_run("console-xss", {}).id
    run_reaching(submitter, done, "succeeded")
    page.goto(f"{console.url}/login")
    log_in(page, console, cast.approver)
    for path in ("/runs", "/runs?sort=oldest", "/runs?q=%25_%5C", "/approvals",
                 f"/runs/{moving}", f"/runs/{done}", f"/runs/{done}/actions/fork"):
        page.goto(console.url + path)
        expect(page.locator("#main")).to_be_visible()
        expect(page.locator("body")).to_have_attribute("data-live-mode", "stream")
    # The run page follows its run through the stream until it waits.
    page.goto(f"{console.url}/runs/{moving}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "waiting",
                                                         timeout=60_000)
