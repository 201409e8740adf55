"""The import graph's rules (issue 15), read from the source's AST.

Arrows point down: ``tasks/`` calls the engine, never the public API module;
agent definitions (``agent.py``, ``tools.py``) do not reach into the engine.
And imports sit at the tops of files: an import hidden in a function body (to
dodge an import-time side effect, or a cycle) must say why in a comment on it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("agent_worker", "tasks", "store")
#: How far above an import its explaining comment may sit (the comment may
#: precede the ``try:`` or ``if`` that guards the import).
COMMENT_REACH = 3


def _files(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The absolute module names ``node`` imports (``from x import y`` counts
    as both ``x`` and ``x.y``, since ``y`` may be a submodule)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: -node.level]
        base = ".".join([*parts, base] if base else parts)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("tasks", "store"):  # installed under agent_worker (pyproject.toml)
        parts.insert(0, "agent_worker")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    module = _module(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(node, module):
                yield node.lineno, name


def _function_imports(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    seen: set[int] = set()
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in seen:
                    seen.add(id(node))
                    yield node


def _explained(lines: list[str], lineno: int) -> bool:
    """A ``#`` comment on the import's line or within ``COMMENT_REACH`` lines above."""
    window = lines[max(lineno - 1 - COMMENT_REACH, 0): lineno]
    return any("#" in line for line in window)


def test_no_import_inside_a_function_without_a_comment_saying_why() -> None:
    unexplained = []
    for path in _files(*SHIPPED):
        lines = path.read_text().splitlines()
        for node in _function_imports(path):
            if not _explained(lines, node.lineno):
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                   f"{lines[node.lineno - 1].strip()}")
    assert not unexplained, "imports inside functions with no comment saying why:\n" + "\n".join(
        unexplained)


def test_the_checker_finds_an_unexplained_import(tmp_path: Path) -> None:
    """The rule above is not vacuous: it sees a bare import in a function."""
    source = "def f():\n    x = 1\n\n    import json\n    return json\n"
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Import))
    assert not _explained(source.splitlines(), node.lineno)
    assert _explained(("def f():\n    # json is slow to import\n" + source[9:]).splitlines(),
                      node.lineno + 1)


def test_tasks_never_import_the_public_api_module() -> None:
    arrows = [f"{p.relative_to(ROOT)}:{line} imports {name}"
              for p in _files("tasks") for line, name in _imports(p)
              if name == "agent_worker.api" or name.startswith("agent_worker.api.")]
    assert not arrows, arrows


def test_agent_definitions_never_import_the_engine() -> None:
    definitions = [ROOT / "agent_worker" / "agent.py", ROOT / "agent_worker" / "tools.py"]
    arrows = [f"{p.relative_to(ROOT)}:{line} imports {name}"
              for p in definitions for line, name in _imports(p)
              if name == "agent_worker.engine" or name.startswith("agent_worker.engine.")]
    assert not arrows, arrows
