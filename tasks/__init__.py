"""Celery adapter: ``celery -A tasks worker`` finds ``app`` here.

``app`` is built on first access (PEP 562), so importing ``tasks`` or any module
under it reads no settings and imports no agent module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.celeryapp import get_app

if TYPE_CHECKING:
    from celery import Celery

    app: Celery


def __getattr__(name: str) -> Any:
    if name == "app":
        return get_app()
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


__all__ = ["app"]
