"""Cancelling running laps on a broker connection loss only where the pool can
stop them (tasks/runtime.py, issue 47): the worker decides when it starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery
from celery.concurrency.thread import TaskPool as ThreadsPool

from agent_worker.tasks import runtime as worker_runtime


@pytest.mark.parametrize(("pool", "can"), [
    ("prefork", True),  # kills the pool child (terminate_job bound at pool start)
    ("threads", False),
    (ThreadsPool, False),  # the CLI hands Celery a class
    ("solo", False),
])
def test_only_prefork_like_pools_can_cancel(pool: str | type, can: bool) -> None:
    assert worker_runtime.pool_can_cancel(pool) is can


@pytest.mark.parametrize(("pool", "cancels"), [("prefork", True), ("threads", False)])
def test_the_worker_keeps_cancelling_only_where_it_can(monkeypatch: pytest.MonkeyPatch,
                                                       pool: str, cancels: bool) -> None:
    monkeypatch.setattr(worker_runtime, "_cancel_turned_off", False)
    app = Celery("t", set_as_current=False)
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = True
    worker_runtime._cancel_only_if_the_pool_can(sender=SimpleNamespace(app=app, pool_cls=pool))
    assert app.conf.worker_cancel_long_running_tasks_on_connection_loss is cancels
    assert worker_runtime._cancel_turned_off is not cancels
