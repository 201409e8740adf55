"""The headless browser the console's tests and screenshots use: the
operating system's Chromium (``apt-get install chromium``, which
deploy/local/install.sh does), driven by Playwright pointed at that executable.

Why Playwright and not Selenium: Playwright talks to Chromium over the DevTools
protocol itself, so it needs no chromedriver whose version must match the
browser's, and its waits (``expect(...).to_have_text``) retry until a deadline,
which a page that refreshes itself needs. Why the system browser: Playwright's
own download (``playwright install``) is unreachable from these machines, and
the OS package gets security updates with the rest of the system.
"""

from __future__ import annotations

import shutil

from playwright.sync_api import Browser, Playwright

from tests.support import unavailable

#: Names the Debian/Ubuntu packages give the browser.
EXECUTABLES = ("chromium", "chromium-browser")


def chromium_executable() -> str | None:
    """The system Chromium's path, or None when no browser is installed."""
    for name in EXECUTABLES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The system Chromium's path; without one the calling test is skipped with
    the reason locally and failed in CI (``tests.support.unavailable``), so the
    browser scenarios can never silently vanish from CI."""
    path = chromium_executable()
    if path is None:
        unavailable(f"no chromium on PATH (looked for {', '.join(EXECUTABLES)}): the browser "
                    "tests drive the OS's Chromium; deploy/local/install.sh runs "
                    "apt-get install chromium")
    return path


def launch(playwright: Playwright) -> Browser:
    """Headless Chromium from the OS. ``--no-sandbox``: these machines run
    everything as root, where Chromium's sandbox refuses to start.

    Raises:
        FileNotFoundError: no Chromium on PATH.
    """
    path = chromium_executable()
    if path is None:
        raise FileNotFoundError(f"no browser on PATH (looked for {', '.join(EXECUTABLES)}); "
                                "deploy/local/install.sh installs the OS package 'chromium'")
    return playwright.chromium.launch(executable_path=path, headless=True,
                                      args=["--no-sandbox"])


__all__ = ["chromium_executable", "launch", "require_chromium"]
