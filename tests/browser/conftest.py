"""One console, one worker fleet and one headless Chromium per test module:
starting them costs seconds (an interpreter, Celery's pool, a browser), the
scenarios then take a fraction of one each. Each test gets a fresh browser
context (no cookies), so logins never leak between scenarios.

The console is ``agent-worker console`` as a subprocess on the session's test
database; its users live in a tenant of their own, so runs other tests left
in that database never show up in the inbox these tests read.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Error,
    Page,
    expect,
    sync_playwright,
)

from agent_worker.api import AgentWorker
from agent_worker.core.principal import Principal
from tests.browser.chromium import launch, require_chromium
from tests.browser.server import Cast, ConsoleServer, User
from tests.console.agents import APPROVERS
from tests.support import Fleet, client_on, logs, worker_environ

AGENTS = "tests.console.agents"
#: How long a page may take to show what a test expects (Playwright's default, 5 s,
#: is too short on a loaded CI machine; a failing expectation still fails).
PATIENCE_MS = 20_000
expect.set_options(timeout=PATIENCE_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium from the OS; without one: skipped locally, failed in CI."""
    require_chromium()
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh context per test: no cookie, so no session, from an earlier scenario.
    Any dialog (``alert`` from an injected script) fails the test that caused it."""
    context = browser.new_context()
    context.set_default_timeout(PATIENCE_MS)
    tab = context.new_page()
    dialogs: list[str] = []

    def refuse(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", refuse)
    yield tab
    context.close()
    assert not dialogs, f"a page opened a dialog: {dialogs}"


@pytest.fixture(scope="module")
def cast() -> Cast:
    tenant = f"browser-{uuid.uuid4().hex[:8]}"

    def user(name: str, *roles: str) -> User:
        return User(f"{name}@{tenant}", tenant, roles, secrets.token_urlsafe(12))

    return Cast(tenant, approver=user("ann", "approver", APPROVERS),
                viewer=user("vic", "submitter", APPROVERS),
                operator=user("otto", "operator"))


@pytest.fixture(scope="module")
def console_env(database_url: str, broker_url: str,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Workers' and the console's environment: the test services, this module's
    agents, a fixed session key and a quick refresh of a moving run's page."""
    env = worker_environ(database_url, broker_url, tmp_path_factory.mktemp("faults"),
                         agent_modules=AGENTS)
    env.update(AGENT_WORKER_CONSOLE_SECRET=secrets.token_urlsafe(32),
               AGENT_WORKER_CONSOLE_POLL_SECONDS="0.5")
    return env


@pytest.fixture(scope="module")
def browser_fleet(console_env: dict[str, str],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One real Celery worker (a subprocess, as in production) for the module."""
    fleet = Fleet(console_env, tmp_path_factory.mktemp("fleet"))
    fleet.worker(concurrency=2)
    yield fleet
    fleet.close()
    print(logs(fleet))  # shown only when a test failed


@pytest.fixture(scope="module")
def console(console_env: dict[str, str], cast: Cast, browser_fleet: Fleet,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """``agent-worker console`` with the cast's users, serving once this returns."""
    log = tmp_path_factory.mktemp("console") / "console.log"
    server = ConsoleServer(console_env, log, cast.users).start()
    yield server
    server.stop()
    print(log.read_text(errors="replace")[-3000:])  # shown only when a test failed


@pytest.fixture(scope="module")
def submitter(console_env: dict[str, str], cast: Cast) -> Iterator[AgentWorker]:
    """The application starting runs in the cast's tenant, from the test process."""
    with pytest.MonkeyPatch.context() as patch:
        for client in client_on(console_env, patch):
            yield client.acting_as(Principal("app", cast.tenant, ("submitter",)))


@pytest.fixture
def errors(page: Page) -> Iterator[list[str]]:
    """What the pages log as errors (and scripts that throw): the test fails
    at its end unless there were none."""
    found: list[str] = []

    def logged(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.append(f"{page.url}: {message.text}")

    def thrown(error: Error) -> None:
        found.append(f"{page.url}: {error}")

    page.on("console", logged)
    page.on("pageerror", thrown)
    yield found
    assert found == []
