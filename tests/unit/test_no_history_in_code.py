"""History belongs in git log, not in the code: no production module names
the issue (or the bug of an issue) that brought a line about. A comment or
docstring says why the code is as it is, which stays true after the issue is
closed; "issue 16" only sends the reader elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("agent_worker", "tasks", "store")
#: "issue 16", "issues 18 and 19", "issue #3", "Issue 21's".
ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def _references(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if ISSUE_REFERENCE.search(line)]


def test_no_issue_numbers_in_production_code() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {path.read_text().splitlines()[n - 1].strip()}"
             for package in SHIPPED for path in sorted((ROOT / package).rglob("*.py"))
             for n in _references(path.read_text())]
    assert not found, "issue references (say why instead; history is git's):\n" + "\n".join(
        found)


def test_the_checker_sees_an_issue_reference() -> None:
    """The rule above is not vacuous, and leaves ordinary words alone."""
    text = '"""Child runs (issue 19)."""\n# see Issue #3\nx = 1  # issues 18 and 19'
    assert _references(text) == [1, 2, 3]
    assert _references("# this issue is settled by the fence\nissued = 2\n") == []
