"""The Celery app: ``celery -A tasks worker`` / ``celery -A tasks beat``.

Built on first use (``get_app()``, or ``tasks.app``), never at import: building
it reads settings and imports the agent modules, which a producer that only
sends laps, a CLI command or a test importing ``tasks.routing`` must not pay for
(nor be broken by, when the settings are not there yet).

Every setting below guards against a measured trap (../shared/CELERY.md). The
broker only carries hints; the lap is claimed and committed in Postgres.
"""

from __future__ import annotations

import os
from functools import cache

from celery import Celery
from kombu import Queue

from agent_worker.agent import registry
from agent_worker.constants import (
    MAINT_QUEUE,
    PRUNE_TASK_NAME,
    SCHEDULE_TASK_NAME,
    SWEEP_TASK_NAME,
)
from agent_worker.deploy_checks import check_deploy_secrets
from agent_worker.settings import get_settings
from tasks.broker import EVENT_EXCHANGE
from tasks.routing import lap_queue, served_pairs


def make_app() -> Celery:
    s = get_settings()
    # Worker, beat and Flower all load this app: none starts guarded by CHANGE_ME.
    check_deploy_secrets(s, os.environ)
    registry.import_modules(s.agent_modules.split(","))
    # amqp: kombu's Redis transport with one client per channel (tasks.broker).
    app = Celery("agent_worker", broker=s.broker_url, amqp="tasks.broker:LapAMQP",
                 include=["tasks.lap", "tasks.sweeper", "tasks.logging", "tasks.serving",
                          "tasks.schedules", "tasks.garbage"])
    queues = [Queue(lap_queue(n, v)) for n, v in served_pairs(s)] + [Queue(MAINT_QUEUE)]
    app.conf.update(
        # JSON only: a pickled message is code execution for whoever can write to Redis.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # Ack after the lap, so a dead worker's lap is redelivered, not lost...
        task_acks_late=True,
        # ...including when the pool child is SIGKILLed/OOM-killed (else acked and lost).
        task_reject_on_worker_lost=True,
        # One lap at a time per process: no lap waits behind another in a prefetch buffer.
        worker_prefetch_multiplier=1,
        # Postgres is the state store; results in Redis would only grow.
        task_ignore_result=True,
        # A hung tool is interrupted (soft) and then killed (hard); both well below the
        # visibility timeout, so a healthy lap is never redelivered while it runs.
        task_soft_time_limit=s.lap_soft_time_limit_seconds,
        task_time_limit=s.lap_time_limit_seconds,
        broker_transport_options={
            "visibility_timeout": s.visibility_timeout_seconds,
            # kombu >= 5.7: restore unacked messages of dead workers more eagerly.
            "unacked_restore_interval": 30,
        },
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A broker blip re-pushes running laps; cancel them instead of running twice
        # (the fenced commit makes any remaining duplicate harmless).
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # SIGTERM (remapped to SIGQUIT via REMAP_SIGTERM) gives laps this long, then
        # hands them back to the broker at once instead of waiting for the VT.
        worker_soft_shutdown_timeout=s.soft_shutdown_timeout_seconds,
        worker_enable_soft_shutdown_on_idle=True,
        # Flower needs task events, including "sent" from producers (each a Redis
        # publish per lap: AGENT_WORKER_TASK_EVENTS=false saves them, BENCHMARKS.md).
        worker_send_task_events=s.task_events,
        task_send_sent_event=s.task_events,
        # Celery's default, named: its publishes skip the wait for Redis's reply.
        event_exchange=EVENT_EXCHANGE,
        # The worker's task events go out in timed batches (tasks.consumer).
        worker_consumer="tasks.consumer:LapConsumer",
        # The pool: prefork for CPU-bound laps, threads for laps that wait on a
        # model (README: IO-bound fleets). A --pool/--concurrency flag wins.
        worker_pool=s.worker_pool,
        **({"worker_concurrency": s.worker_concurrency} if s.worker_concurrency else {}),
        # Separate queues: sweeps never wait behind long laps.
        task_queues=queues,
        task_default_queue=MAINT_QUEUE,
        worker_hijack_root_logger=False,
        beat_schedule={
            "sweep": {"task": SWEEP_TASK_NAME, "schedule": s.sweep_interval_seconds,
                      "options": {"queue": MAINT_QUEUE, "expires": s.sweep_interval_seconds * 5}},
            "prune": {"task": PRUNE_TASK_NAME, "schedule": 3600.0,
                      "options": {"queue": MAINT_QUEUE, "expires": 1800}},
            # Durable schedules: a pass that expired in the queue is harmless,
            # the next one fires what it would have (catch-up rules included).
            "schedules": {"task": SCHEDULE_TASK_NAME, "schedule": s.schedule_interval_seconds,
                          "options": {"queue": MAINT_QUEUE,
                                      "expires": s.schedule_interval_seconds * 5}},
        },
    )
    return app


@cache
def get_app() -> Celery:
    """The process's one app; the lap and beat tasks (``shared_task``) join it
    when it finalises."""
    return make_app()
