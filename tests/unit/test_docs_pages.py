"""The documentation site's pages keep up with what they describe, checked
without building the site (CI builds it too, with ``mkdocs build --strict``):
a runbook for every alert rule, every page in the navigation, and the pages
generated at build time (CLI, database schema) covering every command and
table."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import yaml

from tests.support import ROOT
from tests.support_docs import SITE_PAGES

MKDOCS = (ROOT / "mkdocs.yml").read_text()


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hooks",
                                                  ROOT / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_alert_rule_has_a_runbook() -> None:
    rules = yaml.safe_load((ROOT / "deploy/k8s/prometheus-alerts.yaml").read_text())
    alerts = [r["alert"] for group in rules["spec"]["groups"] for r in group["rules"]]
    runbooks = set(re.findall(r"^## (\w+)$", (ROOT / "docs/guides/incidents.md").read_text(),
                              re.M))
    assert len(alerts) >= 7
    missing = [a for a in alerts if a not in runbooks]
    assert not missing, f"docs/guides/incidents.md has no runbook for {missing}"


def test_every_page_is_in_the_navigation() -> None:
    nav = MKDOCS[MKDOCS.index("\nnav:"):]
    listed = {f"docs/{page}" for page in re.findall(r":\s+([\w/.-]+\.md)$", nav, re.M)}
    assert set(SITE_PAGES) == listed, (
        f"not in mkdocs.yml's nav: {set(SITE_PAGES) - listed}; "
        f"listed but missing: {listed - set(SITE_PAGES)}")
    for section in ("Quickstart", "Concepts", "Guides", "Reference", "Benchmarks", "Changelog"):
        assert f"  - {section}:" in nav, section


def test_the_cli_reference_lists_every_command() -> None:
    import typer.main

    from agent_worker.cli import app

    text = _hooks().cli_reference()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="agent-worker")
    names = root.list_commands(ctx)  # type: ignore[attr-defined]
    assert {"submit", "runs", "approve", "schedules", "share", "console"} <= set(names)
    for name in names:
        assert f"`agent-worker {name}`" in text, name
    assert "`agent-worker runs list`" in text and "--status" in text


def test_the_schema_reference_lists_every_table() -> None:
    hooks = _hooks()
    text = hooks.schema_reference()
    tables = list(hooks._load_models().metadata.tables)
    assert {"runs", "checkpoints", "messages", "effects", "events", "approvals"} <= set(tables)
    for table in tables:
        assert f"## `{table}`" in text, table


def test_the_changelog_is_on_the_site() -> None:
    assert '--8<-- "CHANGELOG.md"' in (ROOT / "docs/changelog.md").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    unreleased = changelog.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    assert "documentation site" in unreleased
