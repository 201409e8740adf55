"""Worker logging: our formatter on the handlers Celery sets up, so every line
a lap logs carries its run id, lap, agent, tenant and attempt (JSON lines with
``AGENT_WORKER_LOG_JSON=true``). Listed in the app's ``include`` so the signals
are connected before the worker configures logging."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import after_setup_logger, after_setup_task_logger

from agent_worker.core import logs
from agent_worker.core.settings import get_settings


@after_setup_logger.connect
@after_setup_task_logger.connect
def _structured(logger: logging.Logger | None = None, **_: Any) -> None:
    if logger is not None:
        logs.install(logger, json_lines=get_settings().log_json)
