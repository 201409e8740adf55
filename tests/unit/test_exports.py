"""The public API's one table (``agent_worker._EXPORTS``) and its static mirror
for type checkers (the ``TYPE_CHECKING`` imports) name the same things."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import agent_worker


def _static_imports() -> dict[str, set[str]]:
    tree = ast.parse(Path(agent_worker.__file__).read_text())
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                found.setdefault(imp.module, set()).update(a.name for a in imp.names)
    return found


def test_type_checking_imports_mirror_the_table() -> None:
    table = {module: set(names) for module, names in agent_worker._EXPORTS.items()}
    assert _static_imports() == table


def test_every_export_resolves_from_its_module() -> None:
    for name in agent_worker.__all__:
        module = agent_worker._MODULE_OF[name]
        assert getattr(agent_worker, name) is getattr(importlib.import_module(module), name)
