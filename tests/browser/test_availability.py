"""The browser scenarios must never vanish from CI unnoticed: without a
browser they are skipped with the reason on a developer's machine, failed in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.chromium import require_chromium


def test_without_chromium_skipped_locally_with_the_reason_failed_in_ci(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        require_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no chromium on PATH"):
        require_chromium()


def test_the_system_chromium_is_found_on_path(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_chromium() == str(browser)
