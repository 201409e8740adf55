"""The run console: runs, a run's laps and ledger, the approvals
inbox and the actions on a run, in a browser, behind a login.

Starlette with server-rendered Jinja templates (autoescaped) and one small
script for the live parts; no build step. Every page acts as the logged-in
user's principal through ``AgentWorker.acting_as``: the tenant scope, the
roles and the audit log are the API's. Serve it with ``agent-worker console``.

Names load lazily (PEP 562): ``agent-worker console`` registers its command
line (``agent_worker.console.command``) with every other command, and
``agent-worker --help`` must not load Starlette, the API and the store to
list it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # explicit re-exports (``X as X``) for type checkers
    from agent_worker.console.app import app_from_settings as app_from_settings
    from agent_worker.console.app import create_app as create_app
    from agent_worker.console.users import UserBook as UserBook
    from agent_worker.console.users import hash_password as hash_password

_EXPORTS: dict[str, tuple[str, ...]] = {
    "agent_worker.console.app": ("app_from_settings", "create_app"),
    "agent_worker.console.users": ("UserBook", "hash_password"),
}
_SOURCE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _SOURCE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once, then an ordinary attribute
    return value


__all__ = ["UserBook", "app_from_settings", "create_app", "hash_password"]
