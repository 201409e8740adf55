"""agent-worker on a Celery app: ``configure(app)`` on the application's own,
or the stand-alone app ``celery -A agent_worker.tasks worker`` builds.

``configure`` adds only what laps need and leaves the application's own tasks,
queues, routes and schedules as they were: the lap, sweep, prune and schedule
tasks (``shared_task``, so they join the app), their queues and routes, their
beat entries, and per-task options (``acks_late``, time limits) that no global
setting of the application can turn off. What would break a guarantee for every
task of the app (pickle, eager execution, a visibility timeout shorter than a
lap) is refused with ``ConfigurationError``, never silently changed.

Nothing here runs at import: building or configuring an app reads settings and
imports the agent modules, which a producer that only sends laps, a CLI command
or a test importing ``agent_worker.tasks.routing`` must not pay for.

The stand-alone app's settings each guard against a measured trap
(../shared/CELERY.md). The broker only carries hints; the lap is claimed and
committed in Postgres.
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from typing import Any

from celery import Celery
from kombu import Queue

from agent_worker.agent import registry
from agent_worker.core.constants import (
    LAP_TASK_NAME,
    MAINT_QUEUE,
    PRUNE_TASK_NAME,
    SCHEDULE_TASK_NAME,
    SWEEP_TASK_NAME,
)
from agent_worker.core.errors import ConfigurationError
from agent_worker.core.settings import Settings, get_settings
from agent_worker.deploy_checks import check_deploy_secrets
from agent_worker.tasks.routing import lap_queue, served_pairs

#: Importing these registers our tasks (``shared_task``) and connects the
#: worker signals (runtime per process, logging, served versions, GC).
TASK_MODULES = tuple(f"agent_worker.tasks.{name}" for name in (
    "lap", "sweeper", "logging", "serving", "schedules", "garbage"))

#: Content types that execute code when loaded: whoever can write to Redis
#: would run code on every worker.
UNSAFE_CONTENT = frozenset({"pickle", "application/x-python-serialize"})

_configured: list[Celery] = []


def configure(app: Celery, *, settings: Settings | None = None) -> Celery:
    """Make ``app`` (the application's own Celery app) run agent-worker's laps,
    sweeps and schedules beside its own tasks, and send laps through it.

    Call it where the app is defined, so that workers (``celery -A yourapp
    worker``), beat and every process that starts runs import a configured
    app. Returns ``app``.

    Raises:
        ConfigurationError: ``app`` accepts or sends pickle, runs tasks eagerly,
            or sets a visibility timeout shorter than a lap may take.
    """
    s = settings or get_settings()
    check_deploy_secrets(s, os.environ)
    _refuse_unsafe(app, s)
    registry.load_agents(s.agent_modules.split(","))
    for module in TASK_MODULES:
        importlib.import_module(module)
    conf = app.conf
    own = [Queue(lap_queue(n, v)) for n, v in served_pairs(s)] + [Queue(MAINT_QUEUE)]
    queues = list(conf.task_queues or [Queue(conf.task_default_queue)])
    named = {q.name for q in queues}
    conf.task_queues = queues + [q for q in own if q.name not in named]
    # Ours first: a router that matches everything (a catch-all of the
    # application's) must not move the sweeper behind long laps.
    conf.task_routes = [{name: {"queue": MAINT_QUEUE} for name in (
        SWEEP_TASK_NAME, PRUNE_TASK_NAME, SCHEDULE_TASK_NAME)}, *_as_list(conf.task_routes)]
    # First, since Celery applies the first annotation that names a task: ours
    # win over the application's. Our tasks store no result (Postgres is the
    # state store) and are interrupted well below the visibility timeout; a lap
    # is acked only after it ran, and handed back if its worker dies (else
    # acked and lost).
    limits = {"ignore_result": True, "soft_time_limit": s.lap_soft_time_limit_seconds,
              "time_limit": s.lap_time_limit_seconds}
    conf.task_annotations = [{
        LAP_TASK_NAME: {**limits, "acks_late": True, "reject_on_worker_lost": True},
        **{name: limits for name in (SWEEP_TASK_NAME, PRUNE_TASK_NAME, SCHEDULE_TASK_NAME)},
    }, *_as_list(conf.task_annotations)]
    options = dict(conf.broker_transport_options or {})
    options.setdefault("visibility_timeout", s.visibility_timeout_seconds)
    conf.broker_transport_options = options
    conf.beat_schedule = {**(conf.beat_schedule or {}), **_beat_entries(s)}
    _configured[:] = [app]
    return app


def _refuse_unsafe(app: Celery, s: Settings) -> None:
    conf = app.conf
    sent = {conf.task_serializer, conf.result_serializer, conf.event_serializer}
    accepted = {*(conf.accept_content or ()), *(conf.result_accept_content or ())}
    unsafe = sorted((sent | accepted) & UNSAFE_CONTENT)
    if unsafe:
        raise ConfigurationError(
            f"the Celery app sends or accepts {', '.join(unsafe)}: a pickled message runs "
            "code on the worker for whoever can write to the broker; use JSON "
            "(task_serializer='json', accept_content=['json'])")
    if conf.task_always_eager:
        raise ConfigurationError(
            "task_always_eager runs laps inside the process that sends them, with no "
            "redelivery after a crash; use agent_worker.InProcessWorker to run in process")
    timeout = (conf.broker_transport_options or {}).get("visibility_timeout")
    if timeout is not None and timeout <= s.lap_time_limit_seconds:
        raise ConfigurationError(
            f"broker_transport_options visibility_timeout={timeout} s is not above the lap "
            f"time limit ({s.lap_time_limit_seconds} s): Redis would hand a healthy lap to a "
            "second worker while it runs")


def _as_list(value: Any) -> list[Any]:
    """A routes or annotations setting (None, one item, or a sequence) as a list."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _beat_entries(s: Settings) -> dict[str, dict[str, Any]]:
    """Our beat entries, named by their task: a pass that expired in the queue
    is harmless, the next one does what it would have."""
    def every(task: str, seconds: float, expires: float) -> dict[str, Any]:
        return {"task": task, "schedule": seconds,
                "options": {"queue": MAINT_QUEUE, "expires": expires}}
    return {
        SWEEP_TASK_NAME: every(SWEEP_TASK_NAME, s.sweep_interval_seconds,
                               s.sweep_interval_seconds * 5),
        PRUNE_TASK_NAME: every(PRUNE_TASK_NAME, 3600.0, 1800),
        SCHEDULE_TASK_NAME: every(SCHEDULE_TASK_NAME, s.schedule_interval_seconds,
                                  s.schedule_interval_seconds * 5),
    }


def make_app() -> Celery:
    """The stand-alone app: agent-worker's own opinions for a fleet that runs
    only laps, then ``configure`` as for any application's app."""
    s = get_settings()
    app = Celery("agent_worker", broker=s.broker_url, set_as_current=False)
    app.conf.update(
        # JSON only: a pickled message is code execution for whoever can write to Redis.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # One lap at a time per process: no lap waits behind another in a prefetch buffer.
        worker_prefetch_multiplier=1,
        # Postgres is the state store; results in Redis would only grow.
        task_ignore_result=True,
        broker_transport_options={
            "visibility_timeout": s.visibility_timeout_seconds,
            # kombu >= 5.7: restore unacked messages of dead workers more eagerly.
            "unacked_restore_interval": 30,
        },
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A broker blip re-pushes running laps; cancel them instead of running twice
        # (the fenced commit makes any remaining duplicate harmless). Only a pool
        # that can stop a lap (prefork, gevent, eventlet) keeps it: the worker turns
        # it off for threads and solo when it starts (runtime.pool_can_cancel).
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # SIGTERM (remapped to SIGQUIT via REMAP_SIGTERM) gives laps this long, then
        # hands them back to the broker at once instead of waiting for the VT. Only
        # when a lap runs: worker_enable_soft_shutdown_on_idle stays off, since it
        # makes an idle worker sleep the whole timeout too (WorkController.
        # wait_for_soft_shutdown). It exists to give ETA/countdown messages held
        # by an idle worker time to be requeued; we never send any (future laps
        # wait in Postgres, the sweeper sends them when due), and a message a
        # worker still held would come back anyway: redelivered by Redis, re-sent
        # by the sweeper.
        worker_soft_shutdown_timeout=s.soft_shutdown_timeout_seconds,
        # Flower needs task events, including "sent" from producers (each a Redis
        # publish per lap: AGENT_WORKER_TASK_EVENTS=false saves them).
        worker_send_task_events=s.task_events,
        task_send_sent_event=s.task_events,
        # The pool: prefork for CPU-bound laps, threads for laps that wait on a
        # model (README: IO-bound fleets). A --pool/--concurrency flag wins.
        worker_pool=s.worker_pool,
        **({"worker_concurrency": s.worker_concurrency} if s.worker_concurrency else {}),
        # Sweeps and schedules go to their own queue, never behind long laps.
        task_default_queue=MAINT_QUEUE,
        worker_hijack_root_logger=False,
    )
    return configure(app, settings=s)


@cache
def _standalone() -> Celery:
    return make_app()


def get_app() -> Celery:
    """The app laps are sent through: the one ``configure`` was last called
    on in this process (the application's), else the stand-alone app."""
    return _configured[0] if _configured else _standalone()

