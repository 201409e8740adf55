"""The import graph's rules, read from the source's AST.

Arrows point down: ``tasks/`` calls the engine, never the public API module;
agent definitions (``agent.py``, ``tools.py``) do not reach into the engine.
And imports sit at the tops of files: an import hidden in a function body (to
dodge an import-time side effect, or a cycle) must say why in a comment on it.
No two modules import each other at module level, even through others (a
cycle works only in the order the first importer happens to pick), and no
module grows past ``MAX_MODULE_LINES`` (split it by what its parts own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("agent_worker", "tasks", "store")
#: How far above an import its explaining comment may sit (the comment may
#: precede the ``try:`` or ``if`` that guards the import).
COMMENT_REACH = 3
#: The longest a production module may be (STYLE.md: "split past 400").
MAX_MODULE_LINES = 400
#: Module-level import cycles known and accepted, each a sorted tuple of the
#: modules in it, with why it stays. None today: keep it that way.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


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


#: What each layer's modules may import of ours (anything, module level or in a
#: function, even under ``TYPE_CHECKING``): the arrows of DESIGN.md's layers that
#: point down to Core. Core imports only itself; the store only itself and Core.
LAYER_MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "agent_worker.core": ("agent_worker.core",),
    "agent_worker.store": ("agent_worker.store", "agent_worker.core"),
}


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _arrows_up(layer: str) -> list[str]:
    allowed = LAYER_MAY_IMPORT[layer]
    return [f"{p.relative_to(ROOT)}:{line} imports {name}"
            for p, module in ((p, _module(p)) for p in _files(*SHIPPED))
            if _within(module, (layer,))
            for line, name in _imports(p)
            if name == "agent_worker" or (name.startswith("agent_worker.")
                                          and not _within(name, allowed))]


@pytest.mark.parametrize("layer", sorted(LAYER_MAY_IMPORT))
def test_layers_import_only_what_lies_below_them(layer: str) -> None:
    arrows = _arrows_up(layer)
    assert not arrows, f"{layer} imports outside {LAYER_MAY_IMPORT[layer]}:\n" + "\n".join(arrows)


def test_the_layer_rule_sees_an_arrow_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: with Core forbidden to itself, every Core module that imports
    another Core module is reported."""
    monkeypatch.setitem(LAYER_MAY_IMPORT, "agent_worker.core", ("agent_worker.nothing",))
    assert any("agent_worker/core/checkpoint.py" in a for a in _arrows_up("agent_worker.core"))


def test_agent_definitions_never_import_the_engine() -> None:
    definitions = [ROOT / "agent_worker" / "agent.py", ROOT / "agent_worker" / "tools.py"]
    arrows = [f"{p.relative_to(ROOT)}:{line} imports {name}"
              for p in definitions for line, name in _imports(p)
              if name == "agent_worker.engine" or name.startswith("agent_worker.engine.")]
    assert not arrows, arrows


def _production() -> dict[str, Path]:
    """Every shipped module by its installed name."""
    return {_module(p): p for p in _files(*SHIPPED)}


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: at the top level and
    in its ``if``/``try`` blocks, not in functions or classes, and not under
    ``if TYPE_CHECKING:`` (which never runs)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level_imports(node.body)
            yield from _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level_imports(block)


def _depends_on(path: Path, known: dict[str, Path]) -> set[str]:
    """The production modules ``path`` imports at module level. ``from pkg
    import sub`` depends on the submodule ``pkg.sub``, not on ``pkg`` itself
    (a package's ``__init__`` runs before any of its submodules, whichever
    imports it: that edge is no cycle)."""
    module = _module(path)
    found: set[str] = set()
    for node in _module_level_imports(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = _imported(node, module)[0]
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in known else base)
    return {name for name in found if name in known and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_level_import_cycles() -> None:
    known = _production()
    graph = {name: _depends_on(path, known) for name, path in known.items()}
    cycles = set(_cycles(graph)) - KNOWN_CYCLES
    assert not cycles, "module-level import cycles:\n" + "\n".join(
        " <-> ".join(c) for c in sorted(cycles))


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The rule above is not vacuous: a loop through three modules is one
    cycle, and a module importing a package's submodule is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": set(), "p.s": {"p"}}
    assert _cycles(graph) == [("a", "b", "c")]


def test_no_production_module_is_over_the_size_limit() -> None:
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in _files(*SHIPPED)
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)
