"""``CeleryDispatcher.queued``: how many lap messages each version's queue
holds, as the sweeper reads it (``store.handoffs``), on the real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from agent_worker.store.base import DueLap
from agent_worker.tasks.dispatch import READ_TIMEOUT, CeleryDispatcher
from agent_worker.tasks.routing import lap_queue

pytestmark = pytest.mark.integration

SENT = ("queue-reading", "1")
NEVER = ("queue-reading", "2")


def _app(url: str) -> Celery:
    app = Celery("queue-reading", broker=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


@pytest.fixture
def broker(broker_url: str) -> Iterator[str]:
    r = redis.Redis.from_url(broker_url)
    r.delete(lap_queue(*SENT), lap_queue(*NEVER))
    yield broker_url
    r.delete(lap_queue(*SENT), lap_queue(*NEVER))
    r.close()


def test_each_versions_queue_is_counted_and_one_never_used_holds_none(broker: str) -> None:
    dispatcher = CeleryDispatcher(_app(broker))
    assert dispatcher.queued({SENT, NEVER}) == {SENT: 0, NEVER: 0}
    for lap in (1, 2, 3):
        dispatcher.send(DueLap("r", lap, *SENT))
    assert dispatcher.queued({SENT, NEVER}) == {SENT: 3, NEVER: 0}


def test_an_unreachable_broker_is_left_unread_at_once() -> None:
    """The sweep goes on (by age) instead of waiting for Celery's endless
    connection retries."""
    dispatcher = CeleryDispatcher(_app("redis://127.0.0.1:1/0"))
    started = time.monotonic()
    assert dispatcher.queued({SENT}) == {}
    assert time.monotonic() - started < 3 * READ_TIMEOUT
