"""Helpers of the broker tests: an app on our Redis transport, a Redis user
denied some commands (an ACL as a locked-down deployment writes it), and a
watcher of the task events published."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery

from tasks.broker import EVENT_EXCHANGE, LapAMQP


def broker_app(url: str) -> Celery:
    """A Celery app whose connections are ``tasks.broker``'s, JSON only, no tasks."""
    app = Celery(f"broker-test-{uuid.uuid4().hex[:6]}", broker=url, amqp=LapAMQP,
                 set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


@contextmanager
def redis_user_denied(plain: redis.Redis[bytes], broker_url: str, denied: str) -> Iterator[str]:
    """The broker URL of a new Redis user that may run everything but
    ``denied`` (an ACL command rule such as ``-publish``); removed after."""
    user, password = f"denied-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    plain.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                      channels=["*"], commands=["+@all", denied])
    try:
        yield broker_url.replace("redis://", f"redis://{user}:{password}@", 1)
    finally:
        plain.acl_deluser(user)


class EventWatcher:
    """A raw pub/sub subscriber to every task event topic of ``broker_url``'s
    database (kombu prefixes fanout topics with it: pub/sub itself spans
    databases, and other test sessions' workers publish too)."""

    def __init__(self, client: redis.Redis[bytes], broker_url: str) -> None:
        db = int(urlsplit(broker_url).path.strip("/") or 0)
        self.pubsub = client.pubsub()
        self.pubsub.psubscribe(f"/{db}.{EVENT_EXCHANGE}*")
        confirmed = self._next(5)
        assert confirmed is not None and confirmed["type"] == "psubscribe"

    def _next(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.05)
            if message is not None:
                return message
        return None

    def take(self, n: int, timeout: float = 5) -> list[tuple[bytes, dict[str, Any]]]:
        """The next ``n`` events as (topic, message); fewer if they do not come."""
        got: list[tuple[bytes, dict[str, Any]]] = []
        while len(got) < n and (message := self._next(timeout)) is not None:
            got.append((message["channel"], json.loads(message["data"])))
        return got

    def close(self) -> None:
        self.pubsub.close()
