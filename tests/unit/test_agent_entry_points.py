"""Agents found the way application code is found: an installed package that
lists a module or an ``Agent`` in the ``agent_worker.agents`` entry point group
is registered by ``Registry.load_agents``, with no ``AGENT_WORKER_AGENT_MODULES``.

The "installed package" is a real distribution on ``sys.path``: a
``.dist-info`` folder with its ``entry_points.txt``, read by
``importlib.metadata`` as pip's installs are."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_worker.agent import AGENTS_ENTRY_POINT_GROUP, Registry
from agent_worker.core.errors import AgentDefinitionError

MODULE = '''
from agent_worker.agent import Agent
from agent_worker.model.scripted import ScriptedModel, turn

# An agent module registers its agents when imported; this one only records
# that it was, so the test leaves the process's registry as it found it.
IMPORTED = True
AN_AGENT = Agent(name="from-an-object", model=lambda: ScriptedModel(lambda r: turn("ok")))
NOT_AN_AGENT = 42
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution ``billing`` on ``sys.path``, its entry points written by the test."""
    (tmp_path / "billing_agents.py").write_text(MODULE)
    info = tmp_path / "billing-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: billing\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield info
    sys.modules.pop("billing_agents", None)


def _entry_points(info: Path, *lines: str) -> None:
    (info / "entry_points.txt").write_text(f"[{AGENTS_ENTRY_POINT_GROUP}]\n" + "\n".join(lines))


def test_an_entry_point_naming_a_module_or_an_agent_registers_it(installed: Path) -> None:
    _entry_points(installed, "mod = billing_agents", "obj = billing_agents:AN_AGENT")
    assert "billing_agents" not in sys.modules
    registry = Registry()
    registry.load_agents([])
    assert registry.get("from-an-object").name == "from-an-object"
    # A module is imported, as an AGENT_WORKER_AGENT_MODULES module is.
    assert sys.modules["billing_agents"].IMPORTED


def test_an_entry_point_naming_anything_else_is_refused(installed: Path) -> None:
    _entry_points(installed, "bad = billing_agents:NOT_AN_AGENT")
    with pytest.raises(AgentDefinitionError, match="neither a module nor an Agent"):
        Registry().load_agents([])
