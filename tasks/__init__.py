"""The Celery adapter.

In an application's own Celery app: ``agent_worker.tasks.configure(app)``
where the app is defined, then ``celery -A yourapp worker`` / ``beat`` as
usual. Stand-alone: ``celery -A agent_worker.tasks worker`` finds ``app`` here.

``app`` is built on first access (PEP 562), so importing ``agent_worker.tasks``
or any module under it reads no settings and imports no agent module.
"""

from __future__ import annotations

if __name__ == "tasks":  # this folder, imported from a checkout by its old name
    raise ImportError(
        "agent-worker's Celery app moved to `agent_worker.tasks` (so that an application's "
        "own tasks.py cannot clash with it): run `celery -A agent_worker.tasks worker`")

from typing import TYPE_CHECKING, Any

from agent_worker.tasks.celeryapp import configure, get_app

if TYPE_CHECKING:
    from celery import Celery

    app: Celery


def __getattr__(name: str) -> Any:
    if name == "app":
        return get_app()
    raise AttributeError(f"module 'agent_worker.tasks' has no attribute {name!r}")


__all__ = ["app", "configure"]
