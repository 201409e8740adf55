"""The console in a real browser: headless Chromium
from the OS, driven by Playwright, against ``agent-worker console`` and a real
Celery worker on the test database. Each scenario is what a person does:
log in, find the waiting call in the inbox, approve it, watch the run finish;
a principal without the approver role gets no button and a forged POST is
refused; a tool's ``<script>`` stays text; a failed run shows why and where.

The runs start when the module starts (``runs``), so the worker moves them
while the console and the browser start.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

from agent_worker.api import AgentWorker
from tests.browser.server import Cast, ConsoleServer, User
from tests.console.agents import REASONING, REFUSAL, SCRIPT_RESULT
from tests.support import Fleet, run_reaching

# One xdist worker runs the whole module (test.sh: --dist loadgroup), so the
# console, worker and browser start once, not once per xdist worker.
pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.xdist_group("browser")]

#: What must show, as text, of the tool's result (its quotes may be JSON-escaped).
SCRIPT_TEXT = SCRIPT_RESULT.split('"', 1)[0]


@dataclass(frozen=True)
class Runs:
    """The module's runs, by scenario."""

    gift: str
    gift_for_viewer: str
    xss: str
    fails: str


@pytest.fixture(scope="module", autouse=True)
def runs(submitter: AgentWorker, browser_fleet: Fleet) -> Runs:
    """Started first thing in the module (autouse), right after the worker, so
    the worker moves them while the console and the browser start."""

    def start(agent: str) -> str:
        return submitter.start_run(agent, {}).id

    return Runs(gift=start("console-gift"), gift_for_viewer=start("console-gift"),
                xss=start("console-xss"), fails=start("console-fails"))


def log_in(page: Page, console: ConsoleServer, user: User, *, path: str = "/runs") -> None:
    """Through the login form, as a person would; lands on ``path``."""
    page.goto(f"{console.url}/login?next={path}")
    page.get_by_label("User").fill(user.id)
    page.get_by_label("Password").fill(user.password)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#whoami")).to_contain_text(user.id)


def test_log_in_refuses_a_wrong_password_then_lets_the_user_in(
        page: Page, console: ConsoleServer, cast: Cast) -> None:
    page.goto(f"{console.url}/approvals")
    expect(page).to_have_url(f"{console.url}/login?next=/approvals")
    page.get_by_label("User").fill(cast.approver.id)
    page.get_by_label("Password").fill(cast.approver.password + "x")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_contain_text("wrong password")
    expect(page.locator("#whoami")).to_have_count(0)
    page.get_by_label("User").fill(cast.approver.id)
    page.get_by_label("Password").fill(cast.approver.password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{console.url}/approvals")
    expect(page.locator("#whoami")).to_contain_text(f"tenant {cast.tenant}")


def test_approver_finds_the_call_in_the_inbox_approves_it_and_watches_the_run_finish(
        page: Page, console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    run_reaching(submitter, runs.gift, "waiting")
    log_in(page, console, cast.approver)
    # The run's page, opened in a second tab before the decision and never
    # reloaded: only its live refresh can show the run finishing.
    run_tab = page.context.new_page()
    run_tab.goto(f"{console.url}/runs/{runs.gift}")
    expect(run_tab.locator("#run-status")).to_have_attribute("data-status", "waiting")

    page.get_by_role("link", name="Approvals").click()
    card = page.locator(f"#approvals-mine article[data-run-id='{runs.gift}']")
    expect(card).to_contain_text("send_gift")
    expect(card.locator(".reasoning")).to_have_text(REASONING)
    expect(card.locator(".tool-description")).to_contain_text("cannot come back")
    expect(card.get_by_label("Arguments")).to_contain_text('"amount_cents": 2500')
    card.get_by_label("Comment").fill("goodwill, ok")
    card.get_by_role("button", name="Approve").click()
    expect(page.locator("#notice")).to_have_text("Approved.")
    expect(page.locator(f"article[data-run-id='{runs.gift}']")).to_have_count(0)

    expect(run_tab.locator("#run-status")).to_have_attribute("data-status", "succeeded",
                                                             timeout=60_000)
    expect(run_tab.locator("#effects tr[data-effect-status='applied']")).to_contain_text(
        "send_gift")
    decided = submitter.list_approvals(status="approved", run_id=runs.gift)
    assert [(a.decided_by, a.comment) for a in decided] == [(cast.approver.id, "goodwill, ok")]


def test_without_the_approver_role_no_button_and_a_forged_post_is_refused(
        page: Page, console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    run_reaching(submitter, runs.gift_for_viewer, "waiting")
    (approval,) = submitter.list_approvals(status="pending", run_id=runs.gift_for_viewer)
    log_in(page, console, cast.viewer, path="/approvals")
    card = page.locator(f"article[data-approval-id='{approval.id}']")
    expect(card).to_contain_text("send_gift")  # the viewer sees the call ...
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)  # ... not a button
    expect(page.locator("#approvals-mine article")).to_have_count(0)

    # The forged POST: this principal's own session cookie and CSRF token, so
    # only the authorization can refuse it.
    token = page.locator("#logout-form input[name='csrf_token']").get_attribute("value")
    assert token
    answer = page.request.post(f"{console.url}/approvals/{approval.id}/decide",
                               form={"csrf_token": token, "decision": "approve",
                                     "comment": "forged"}, max_redirects=0)
    assert answer.status == 403, answer.text()[:500]
    assert 'data-code="permission_denied"' in answer.text()
    still = submitter.list_approvals(status="pending", run_id=runs.gift_for_viewer)
    assert [a.id for a in still] == [approval.id]
    assert submitter.get_run(runs.gift_for_viewer).status == "waiting"


def test_a_script_in_a_tool_result_renders_as_text(
        page: Page, console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    run_reaching(submitter, runs.xss, "succeeded")
    log_in(page, console, cast.operator, path=f"/runs/{runs.xss}")
    result = page.locator("#messages li[data-role='tool']")
    expect(result).to_contain_text(SCRIPT_TEXT)  # shown, as the characters it is
    assert page.evaluate("window.__pwned") is None  # ... and never run
    expect(page.locator("#injected")).to_have_count(0)
    expect(page.locator("#messages script")).to_have_count(0)
    assert page.title() != "pwned"


def test_a_failed_runs_page_shows_the_error_and_the_failing_lap(
        page: Page, console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    run_reaching(submitter, runs.fails, "failed")
    log_in(page, console, cast.operator, path=f"/runs/{runs.fails}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "failed")
    error = page.locator("#run-error")
    expect(error.locator("#failing-lap")).to_have_attribute("data-lap", "2")
    expect(error.locator("#failing-lap")).to_be_visible()
    expect(error.locator("#error-text")).to_contain_text(REFUSAL)
    expect(page.locator("#lap-timeline tr[data-lap='1']")).to_be_visible()


def test_the_content_security_policy_blocks_nothing_the_pages_use(
        page: Page, console: ConsoleServer, cast: Cast, runs: Runs,
        submitter: AgentWorker) -> None:
    """Every page under the console's policy: no violation reported, the style
    sheet applied and the script running (the live region refreshes)."""
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text)
            if "Content Security Policy" in m.text else None)
    page.add_init_script("document.addEventListener('securitypolicyviolation', e => "
                         "console.error('Content Security Policy: ' + e.violatedDirective"
                         " + ' ' + e.blockedURI))")
    page.goto(f"{console.url}/login")
    log_in(page, console, cast.operator)
    run_reaching(submitter, runs.fails, "failed")
    for path in ("/runs", "/approvals", f"/runs/{runs.fails}", f"/runs/{runs.gift}",
                 f"/runs/{runs.fails}/actions/fork", "/runs/no-such-run"):
        answer = page.goto(console.url + path)
        assert answer is not None
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        # console.css paints the header: the style sheet was allowed.
        header = page.locator("#site-header")
        expect(header).to_have_css("background-color", "rgb(34, 48, 60)")
    # console.js polls a moving run's live region (script-src and connect-src).
    moving = submitter.start_run("console-gift", {}).id
    with page.expect_request(f"**/runs/{moving}/live"):
        page.goto(f"{console.url}/runs/{moving}")
    assert violations == []
