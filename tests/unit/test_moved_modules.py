"""The modules that moved into ``agent_worker.core`` keep their old import
names for one minor version, as the very same module objects, with a
``DeprecationWarning`` that names the new one."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest

import agent_worker.core
import agent_worker.core.config.fleet
import agent_worker.core.errors
from agent_worker.moved import MOVED


def _forget(name: str) -> None:
    """Drop an old name from ``sys.modules`` (and from its parent's attributes)
    so the next import goes through the finder again."""
    sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and sys.modules[parent].__dict__.get(child) is not None:
        delattr(sys.modules[parent], child)


def test_an_old_name_is_the_new_module_with_a_warning() -> None:
    _forget("agent_worker.errors")
    with pytest.warns(DeprecationWarning, match="agent_worker.errors moved to "
                                                "agent_worker.core.errors"):
        old = importlib.import_module("agent_worker.errors")
    assert old is agent_worker.core.errors
    with pytest.raises(old.InvalidInputError):  # one class, whichever name raised it
        raise agent_worker.core.errors.InvalidInputError("x")


def test_a_submodule_of_a_moved_package_is_aliased_too() -> None:
    _forget("agent_worker.config.fleet")
    _forget("agent_worker.config")
    with pytest.warns(DeprecationWarning) as warned:
        old = importlib.import_module("agent_worker.config.fleet")
    assert [str(w.message).split(" moved")[0] for w in warned] == [
        "agent_worker.config", "agent_worker.config.fleet"]
    assert old is agent_worker.core.config.fleet


def test_every_core_module_keeps_its_old_name() -> None:
    top = {f"agent_worker.{m.name}" for m in pkgutil.iter_modules(agent_worker.core.__path__)}
    assert top == set(MOVED)
    assert all(new == "agent_worker.core." + old.rsplit(".", 1)[1] for old, new in MOVED.items())


def test_names_never_moved_are_not_found_by_the_finder() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agent_worker.no_such_module")
