"""Every Python example of README.md and of the documentation site (docs/)
runs, so the docs cannot drift from the code.

A page's ``python`` blocks run in order as one script (a later block may use
what an earlier one defined, as a reader following the page would), in a
subprocess whose working directory is a fresh temporary folder, with this
checkout on ``PYTHONPATH`` and no ``AGENT_WORKER_*`` setting of the caller's:
the examples run against the in-process worker on SQLite files of that folder.
A page whose examples need the local Postgres and Redis carries the comment
``<!-- example: services -->``; it runs with the integration fixtures'
``database_url`` and ``broker_url`` in ``AGENT_WORKER_DATABASE_URL`` and
``AGENT_WORKER_BROKER_URL``, marked ``integration``. A deprecation warning
raised by an example's own code fails it: the docs show the current API.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support_docs import SITE_PAGES, python_blocks

SERVICES = "<!-- example: services -->"


def _pages() -> dict[str, list[str]]:
    """Each page with Python examples, and its blocks."""
    found = {doc: python_blocks((ROOT / doc).read_text()) for doc in ("README.md", *SITE_PAGES)}
    return {doc: blocks for doc, blocks in found.items() if blocks}


PAGES = _pages()


def _params() -> list[Any]:
    return [pytest.param(doc, marks=pytest.mark.integration, id=doc)
            if SERVICES in (ROOT / doc).read_text() else pytest.param(doc, id=doc)
            for doc in PAGES]


def script(doc: str) -> str:
    """The page's examples as one program, each block headed by where it is from."""
    return "\n".join(f"# --- {doc}, python block {i + 1}\n{block}"
                     for i, block in enumerate(PAGES[doc]))


def test_the_examples_are_found() -> None:
    """The extraction sees the pages that carry examples (a changed fence
    syntax must not silently leave them out)."""
    for doc in ("README.md", "docs/quickstart.md", "docs/guides/tools.md",
                "docs/concepts/pauses.md", "docs/guides/approvals.md"):
        assert doc in PAGES, f"{doc} has no python example any more"
    assert sum(len(blocks) for blocks in PAGES.values()) >= 20


@pytest.mark.parametrize("doc", _params())
def test_examples_of_the_page_run(doc: str, tmp_path: Path,
                                  request: pytest.FixtureRequest) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
    env.update(PYTHONPATH=str(ROOT), AGENT_WORKER_DATABASE_URL=f"sqlite:///{tmp_path}/default.db",
               AGENT_WORKER_BROKER_URL="memory://")
    if SERVICES in (ROOT / doc).read_text():
        env.update(AGENT_WORKER_DATABASE_URL=request.getfixturevalue("database_url"),
                   AGENT_WORKER_BROKER_URL=request.getfixturevalue("broker_url"))
    program = tmp_path / "example.py"
    program.write_text(script(doc))
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__",
                           str(program)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=240, check=False)
    assert done.returncode == 0, (f"{doc}'s examples failed ({program}):\n"
                                  f"{(done.stdout + done.stderr)[-4000:]}")
