"""The README stays true: its configuration table is generated from the
settings, and its two set-up commands exist and are what CI runs."""

from __future__ import annotations

import os
from pathlib import Path

from agent_worker.settings import config_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_config_table_matches_settings() -> None:
    start = README.index("<!-- config-table:start -->") + len("<!-- config-table:start -->")
    end = README.index("<!-- config-table:end -->")
    assert README[start:end].strip() == config_table().strip()


def test_two_setup_commands_exist_and_ci_runs_the_test_one() -> None:
    for script in ("deploy/local/demo.sh", "deploy/local/test.sh"):
        assert f"{script}" in README
        assert os.access(ROOT / script, os.X_OK)
    assert "deploy/local/test.sh" in (ROOT / ".ci/run").read_text()
