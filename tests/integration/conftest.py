"""Fixtures the broker tests share: an app on our Redis transport, and a plain
redis-py client beside it to look at what the transport wrote."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tests.integration.brokers import broker_app


@pytest.fixture
def app(broker_url: str) -> Iterator[Celery]:
    app = broker_app(broker_url)
    yield app
    app.close()


@pytest.fixture
def plain(broker_url: str) -> Iterator[redis.Redis[bytes]]:
    client = redis.Redis.from_url(broker_url)
    yield client
    client.close()
