"""Celery adapter: ``celery -A tasks worker`` finds ``app`` here."""

from tasks.app import app

__all__ = ["app"]
