"""Structured logs: which run, lap, agent, tenant and attempt a line is about.

The lap engine opens ``lap_context(run_id, lap)`` around a lap and ``bind()``s
what the claim tells it (agent, tenant, attempt). Every record logged inside,
by the engine, a tool or a library, carries those fields: as JSON keys with
``AGENT_WORKER_LOG_JSON=true`` (one object per line, for Loki, CloudWatch and
friends), or as a ``[run=… lap=…]`` suffix otherwise. A contextvar, not a
thread-local, so the context never leaks from one lap into the next one the
same pool process runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: The fields a lap's records carry, in output order.
FIELDS = ("run_id", "lap", "agent", "tenant", "attempt")

_lap: ContextVar[dict[str, Any] | None] = ContextVar("agent_worker_lap", default=None)

# Attributes every LogRecord has; anything else was passed through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


@contextmanager
def lap_context(run_id: str, lap: int, **fields: Any) -> Iterator[None]:
    """Tag every log record inside with this lap's identity."""
    token = _lap.set({"run_id": run_id, "lap": lap, **fields})
    try:
        yield
    finally:
        _lap.reset(token)


def bind(**fields: Any) -> None:
    """Add fields to the current lap's context (no-op outside a lap)."""
    current = _lap.get()
    if current is not None:
        _lap.set({**current, **fields})


def current() -> dict[str, Any]:
    """The current lap's fields, empty outside a lap."""
    return dict(_lap.get() or {})


def _celery_task() -> dict[str, Any]:
    """The Celery task being executed, if any (workers only; cheap when not)."""
    # Imported here, not at the top: the engine logs through this module and
    # must not import Celery (STYLE.md), so only a worker, which has it loaded
    # already, pays for the lookup.
    try:
        from celery import current_task
    except ImportError:  # pragma: no cover - celery is a dependency
        return {}
    task = current_task
    request = getattr(task, "request", None) if task else None
    task_id = getattr(request, "id", None)
    return {"task_id": task_id, "task": task.name} if task_id and task else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the lap
    context, the Celery task, ``extra=`` fields and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in current().items() if v is not None})
        entry.update(_celery_task())
        entry["process"] = record.process
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class ContextFormatter(logging.Formatter):
    """Whatever line ``inner`` writes (Celery's coloured one, say), plus
    ``[run_id=… lap=… agent=…]`` inside a lap."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        fields = current()
        if not fields:
            return line
        tags = " ".join(f"{k}={fields[k]}" for k in FIELDS if fields.get(k) is not None)
        return f"{line} [{tags}]"


def formatter(json_lines: bool, inner: logging.Formatter | None = None) -> logging.Formatter:
    """The formatter for ``AGENT_WORKER_LOG_JSON``; text mode wraps ``inner``."""
    return JsonFormatter() if json_lines else ContextFormatter(inner)


def install(logger: logging.Logger, *, json_lines: bool) -> None:
    """Put our formatter on every handler of ``logger`` (once)."""
    for handler in logger.handlers:
        old = handler.formatter
        if isinstance(old, JsonFormatter | ContextFormatter):
            continue
        handler.setFormatter(formatter(json_lines, old))


def configure(*, json_lines: bool, level: int = logging.INFO) -> None:
    """Logging for a plain process (the CLI's long-running commands): one
    stderr handler on the root logger."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter(json_lines))
        root.addHandler(handler)
    else:
        install(root, json_lines=json_lines)
    root.setLevel(level)


__all__ = ["FIELDS", "ContextFormatter", "JsonFormatter", "bind", "configure", "current",
           "formatter", "install", "lap_context"]
