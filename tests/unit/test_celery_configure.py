"""``agent_worker.tasks.configure`` on an application's own Celery app: it adds
what laps need, keeps what the application has, and refuses what would break a
guarantee. (The same call through real workers: tests/integration/test_embedding.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from kombu import Queue

from agent_worker.core.constants import LAP_TASK_NAME, MAINT_QUEUE, SWEEP_TASK_NAME
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.settings import Settings
from agent_worker.tasks import celeryapp

SETTINGS = Settings(agent_modules="agent_worker.demo.refund_desk")


@pytest.fixture(autouse=True)
def _no_app_left_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's app stays its own: the process's configured app is restored."""
    monkeypatch.setattr(celeryapp, "_configured", [])


def app_with(**conf: Any) -> Celery:
    app = Celery("shop", broker="memory://", set_as_current=False)
    app.conf.update({"task_serializer": "json", "accept_content": ["json"], **conf})
    return app


def test_keeps_the_applications_queues_routes_and_schedule() -> None:
    mine = {"task": "shop.report", "schedule": 60.0}
    app = app_with(task_queues=[Queue("shop")], task_routes={"shop.*": {"queue": "shop"}},
                   beat_schedule={"report": mine})

    @app.task(name="shop.report")
    def report() -> None:
        """The application's own task."""

    celeryapp.configure(app, settings=SETTINGS)
    names = [q.name for q in app.conf.task_queues]
    assert names[0] == "shop" and "laps.refund-desk.v1" in names and MAINT_QUEUE in names
    assert app.conf.task_routes[-1] == {"shop.*": {"queue": "shop"}}
    assert app.conf.task_routes[0][SWEEP_TASK_NAME] == {"queue": MAINT_QUEUE}
    assert app.conf.beat_schedule["report"] == mine
    assert app.conf.beat_schedule[SWEEP_TASK_NAME]["options"]["queue"] == MAINT_QUEUE
    assert {"shop.report", LAP_TASK_NAME, SWEEP_TASK_NAME} <= set(app.tasks)
    assert celeryapp.get_app() is app, "laps are sent through the configured app"


def test_an_app_with_no_queues_keeps_consuming_its_default_queue() -> None:
    app = celeryapp.configure(app_with(), settings=SETTINGS)
    assert "celery" in [q.name for q in app.conf.task_queues]


def test_our_task_options_win_over_the_applications_globals_and_annotations() -> None:
    app = app_with(task_acks_late=False, task_reject_on_worker_lost=False,
                   task_annotations={LAP_TASK_NAME: {"acks_late": False}})
    celeryapp.configure(app, settings=SETTINGS)
    lap = app.tasks[LAP_TASK_NAME]
    assert lap.acks_late and lap.reject_on_worker_lost and lap.ignore_result
    assert lap.time_limit == SETTINGS.lap_time_limit_seconds
    assert lap.soft_time_limit == SETTINGS.lap_soft_time_limit_seconds


@pytest.mark.parametrize("conf", [
    {"accept_content": ["json", "pickle"]},
    {"task_serializer": "pickle"},
    {"result_accept_content": ["application/x-python-serialize"]},
    {"event_serializer": "pickle"},
])
def test_pickle_is_refused(conf: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="pickle"):
        celeryapp.configure(app_with(**conf), settings=SETTINGS)


def test_eager_execution_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="task_always_eager"):
        celeryapp.configure(app_with(task_always_eager=True), settings=SETTINGS)


def test_a_visibility_timeout_shorter_than_a_lap_is_refused() -> None:
    short = {"visibility_timeout": int(SETTINGS.lap_time_limit_seconds) - 1}
    with pytest.raises(ConfigurationError, match="visibility_timeout"):
        celeryapp.configure(app_with(broker_transport_options=short), settings=SETTINGS)
    long = {"visibility_timeout": int(SETTINGS.lap_time_limit_seconds) + 60, "x": 1}
    app = celeryapp.configure(app_with(broker_transport_options=long), settings=SETTINGS)
    assert app.conf.broker_transport_options == long


def test_a_refused_app_is_left_as_it_was() -> None:
    app = app_with(accept_content=["pickle"])
    with pytest.raises(ConfigurationError):
        celeryapp.configure(app, settings=SETTINGS)
    assert app.conf.task_queues is None and not app.conf.beat_schedule
    assert celeryapp._configured == []
