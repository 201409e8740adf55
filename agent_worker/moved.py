"""Old import names of modules that moved into ``agent_worker.core``.

An application that imported ``agent_worker.errors`` (or any other module
listed in ``MOVED``) keeps working for one minor version: the import returns
the very module object at its new name, with a ``DeprecationWarning`` naming
it, so ``isinstance`` checks, ``except`` clauses and monkeypatching see one
module, not a copy. A ``sys.meta_path`` finder does it, through importlib's
supported protocol, rather than a stub file per old name at the package's top.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

from agent_worker.core.deprecation import deprecated

#: Old module name -> the name it has now.
MOVED: dict[str, str] = {
    f"agent_worker.{name}": f"agent_worker.core.{name}"
    for name in ("authorization", "budget", "checkpoint", "clock", "config", "constants",
                 "deprecation", "errors", "faults", "logs", "messages", "principal",
                 "redaction", "runstate", "settings", "untrusted", "vocabulary")
}


class _Alias(Loader):
    """Loads an old name as the module at its new name."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        deprecated(f"{spec.name} moved to {self.new}; the old name will be removed in the "
                   f"next minor version")
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


class MovedModules(MetaPathFinder):
    """Finds the old names in ``MOVED`` (and their submodules, e.g.
    ``agent_worker.config.fleet``)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        for old, new in MOVED.items():
            if fullname == old or fullname.startswith(old + "."):
                return ModuleSpec(fullname, _Alias(new + fullname[len(old):]))
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing the package twice,
    e.g. after a reload, must not stack finders)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())


__all__ = ["MOVED", "MovedModules", "install"]
