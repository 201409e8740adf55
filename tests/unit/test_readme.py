"""The README and the documentation site stay true: the site's configuration
table is generated from the settings, the README's two set-up commands exist
and are what CI runs, and the README stays a front door (short, every link
resolving)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent_worker.core.settings import config_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs/reference/configuration.md").read_text()
MAX_README_LINES = 350


def test_config_table_matches_settings() -> None:
    start = (CONFIGURATION.index("<!-- config-table:start -->")
             + len("<!-- config-table:start -->"))
    end = CONFIGURATION.index("<!-- config-table:end -->")
    assert CONFIGURATION[start:end].strip() == config_table().strip()


def test_two_setup_commands_exist_and_ci_runs_the_test_one() -> None:
    for script in ("deploy/local/demo.sh", "deploy/local/test.sh"):
        assert f"{script}" in README
        assert os.access(ROOT / script, os.X_OK)
    assert "deploy/local/test.sh" in (ROOT / ".ci/run").read_text()


def test_readme_is_a_front_door() -> None:
    lines = README.count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the site holds the rest"
    for must in ("## The two commands", "### The first hour", "```python",
                 "## Add agent-worker to your application", "docs/quickstart.md",
                 "docs/reference/api.md"):
        assert must in README, must


def _anchors(markdown: str) -> set[str]:
    """GitHub's (and MkDocs's) heading ids: lower case, punctuation dropped,
    spaces to hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S),
                          re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_readme_link_resolves() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", README, flags=re.S))
    assert len(links) >= 20
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README links to {link}: no {target.relative_to(ROOT)}"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"README links to {link}: no heading"
