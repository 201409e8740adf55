"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_worker.core.settings import get_settings
from agent_worker.tasks import runtime as worker_runtime

SizedWorker = Callable[[str | type, object], worker_runtime.WorkerRuntime]


@pytest.fixture
def sized_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SizedWorker]:
    """A worker process's runtime on a SQLite file of its own, sized as
    Celery's ``worker_init`` sizes it for a pool and a concurrency (the
    settings from the environment the test sets first); closed after."""
    monkeypatch.setenv("AGENT_WORKER_DATABASE_URL", f"sqlite:///{tmp_path / 'w.db'}")
    get_settings.cache_clear()
    worker = worker_runtime.WorkerRuntime()
    monkeypatch.setattr(worker_runtime, "_worker", worker)

    def sized(pool: str | type, concurrency: object) -> worker_runtime.WorkerRuntime:
        worker_runtime._size_for_the_pool(
            sender=SimpleNamespace(pool_cls=pool, concurrency=concurrency))
        return worker

    try:
        yield sized
    finally:
        worker.close()
        get_settings.cache_clear()
