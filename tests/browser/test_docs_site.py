"""The documentation site renders in a browser: built from this checkout with
``mkdocs build --strict`` into a temporary folder, served by ``python -m
http.server`` on a free loopback port, and opened in the OS's headless
Chromium (as the console's browser tests are). The quickstart and a reference
page generated from the code must show their heading and content, with no
console error and no failed request (the site loads nothing from the network:
no web fonts, no CDN)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import ConsoleMessage, Page, Request, expect

from tests.browser.server import free_port
from tests.support import ROOT, answers, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The built site's base URL."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--site-dir", str(out)], cwd=ROOT, text=True, capture_output=True,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300,
                           check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(f"{base}/"), timeout=30, what="the docs' http.server")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


def _open(page: Page, url: str) -> list[str]:
    """Open ``url``; returns the list that collects its console errors,
    uncaught exceptions and failed requests as they come."""
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    def failed(request: Request) -> None:
        problems.append(f"request failed: {request.url} ({request.failure})")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", failed)
    page.goto(url, wait_until="networkidle")
    return problems


def test_the_quickstart_renders(site: str, page: Page) -> None:
    problems = _open(page, f"{site}/quickstart/")
    expect(page.locator("article h1")).to_have_text(re.compile(r"^Quickstart"))
    expect(page.locator("article h2#the-two-commands")).to_be_visible()
    expect(page.locator("article").get_by_text("deploy/local/demo.sh").first).to_be_visible()
    expect(page.locator("article h2#add-agent-worker-to-your-application")).to_be_visible()
    expect(page.locator("nav").get_by_text("Concepts").first).to_be_attached()
    assert not problems, problems


def test_the_python_api_reference_renders(site: str, page: Page) -> None:
    problems = _open(page, f"{site}/reference/api/")
    expect(page.locator("article h1")).to_have_text(re.compile(r"^Python API"))
    start_run = page.locator("[id='agent_worker.api.AgentWorker.start_run']")
    expect(start_run).to_be_visible()
    expect(page.locator("article")).to_contain_text("Create a run and send its first lap")
    assert not problems, problems
