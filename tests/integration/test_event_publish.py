"""``tasks.eventpublish`` and ``tasks.consumer`` on a real Redis: a task event published without
waiting for the reply reaches a subscriber as exactly the message kombu's
stock channel publishes; the replies owed are read in batches; a refused
``PUBLISH`` is logged, not raised; a connection the server closed is found
before an event is written into it; a server that is gone raises, so Celery
keeps the event; any other fanout (remote control) keeps kombu's
awaited publish; and a real worker's laps, their events batched by a timer,
each publish all four task events."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Exchange, Producer
from redis.connection import Connection as RedisConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_worker.api import AgentWorker
from tasks import eventpublish
from tasks.broker import EVENT_EXCHANGE, SharedClientChannel
from tasks.eventpublish import REPLIES_OWED_AT_MOST, UnawaitedPublisher
from tests.integration.brokers import EventWatcher, broker_app, redis_user_denied
from tests.support import Fleet, wait_for

pytestmark = pytest.mark.integration

# As Celery declares it on Redis (celery.events.event.get_exchange).
_EVENTS = Exchange(EVENT_EXCHANGE, type="fanout")


@pytest.fixture
def subscriber(plain: redis.Redis[bytes], broker_url: str) -> Iterator[EventWatcher]:
    watcher = EventWatcher(plain, broker_url)
    yield watcher
    watcher.close()


def _send(conn: Connection, event: dict[str, Any], routing_key: str = "task.started") -> None:
    Producer(conn.default_channel, exchange=_EVENTS, serializer="json",
             auto_declare=False).publish(event, routing_key=routing_key, declare=[_EVENTS])


def _publisher(channel: Any) -> UnawaitedPublisher:
    publisher = channel._events
    assert isinstance(publisher, UnawaitedPublisher), "the event did not take the unawaited path"
    return publisher


def test_an_event_arrives_as_kombus_stock_channel_publishes_it(
        app: Celery, broker_url: str, subscriber: EventWatcher) -> None:
    event = {"type": "task-started", "uuid": uuid.uuid4().hex, "hostname": "w@h", "clock": 7}
    with Connection(broker_url) as stock:
        assert not isinstance(stock.default_channel, SharedClientChannel)
        _send(stock, event)
    with app.connection_for_write() as conn:
        _send(conn, event)
        _publisher(conn.default_channel)
    (stock_topic, stock_message), (topic, message) = subscriber.take(2)
    assert topic == stock_topic
    # Each publish draws a fresh delivery tag; everything else is the same.
    assert message["properties"].pop("delivery_tag") != stock_message["properties"].pop(
        "delivery_tag")
    assert message == stock_message


def test_replies_owed_are_read_in_batches_and_every_event_arrives(
        app: Celery, subscriber: EventWatcher) -> None:
    n = 3 * REPLIES_OWED_AT_MOST + 5
    with app.connection_for_write() as conn:
        for i in range(n):
            _send(conn, {"type": "task-received", "n": i})
        owed = _publisher(conn.default_channel)._owed
    assert 0 < owed <= REPLIES_OWED_AT_MOST
    assert [m["body"] for _, m in subscriber.take(n)] == [
        _body({"type": "task-received", "n": i}) for i in range(n)]


def _body(event: dict[str, Any]) -> str:
    """An event's body as kombu encodes it on Redis (base64 of the JSON)."""
    return base64.b64encode(json.dumps(event).encode()).decode()


def test_a_refused_publish_is_logged_not_raised(broker_url: str, plain: redis.Redis[bytes],
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A Redis user that may not ``PUBLISH``: the publish returns, and the
    refusal is logged when its reply is read."""
    with redis_user_denied(plain, broker_url, "-publish") as url:
        app = broker_app(url)
        try:
            with (caplog.at_level("WARNING", logger="tasks.eventpublish"),
                  app.connection_for_write() as conn):
                for i in range(REPLIES_OWED_AT_MOST + 1):
                    _send(conn, {"type": "task-received", "n": i})
        finally:
            app.close()
    refusals = [r for r in caplog.records if "refused a task event" in r.getMessage()]
    assert len(refusals) == REPLIES_OWED_AT_MOST
    assert "no permissions" in refusals[0].getMessage()


def test_a_connection_the_server_closed_is_found_before_the_next_event(
        app: Celery, plain: redis.Redis[bytes], subscriber: EventWatcher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server drops the events' connection while it is quiet: the next
    event goes out on a new connection instead of into the closed one."""
    monkeypatch.setattr(eventpublish, "QUIET_SECONDS", 0.0)
    with app.connection_for_write() as conn:
        _send(conn, {"type": "task-received", "n": 1})
        connection: Any = _publisher(conn.default_channel)._connection
        host, port = connection._sock.getsockname()[:2]
        assert plain.client_kill(f"{host}:{port}")
        _send(conn, {"type": "task-received", "n": 2})
    assert [m["body"] for _, m in subscriber.take(2)] == [
        _body({"type": "task-received", "n": n}) for n in (1, 2)]


def test_a_server_that_is_gone_raises_so_celery_keeps_the_event() -> None:
    with _port_nobody_listens_on() as port:
        publisher = UnawaitedPublisher(lambda: RedisConnection(host="127.0.0.1", port=port))
        with pytest.raises(RedisConnectionError):
            publisher.publish(["/0.celeryev/task.started"], "{}")


@contextmanager
def _port_nobody_listens_on() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        yield s.getsockname()[1]


def test_other_fanouts_keep_kombus_awaited_publish(app: Celery, plain: redis.Redis[bytes]) -> None:
    """Remote control broadcasts (Celery's pidbox) are not task events."""
    control = Exchange(f"ctl-{uuid.uuid4().hex[:6]}", type="fanout")
    with app.connection_for_write() as conn:
        Producer(conn.default_channel, exchange=control, serializer="json",
                 auto_declare=False).publish({"method": "ping"}, declare=[control])
        channel: Any = conn.default_channel
        assert isinstance(channel, SharedClientChannel) and channel._events is None


def test_every_lap_of_a_worker_publishes_its_four_task_events(
        aw: AgentWorker, fleet: Fleet, subscriber: EventWatcher) -> None:
    """A worker of the suite's pool (its consumer flushes task events on a
    timer): for every lap, task-sent, -received, -started and -succeeded."""
    fleet.worker(concurrency=2)
    run = aw.start_run("loop", {"laps": 6})
    assert aw.wait(run.id, timeout=120).status == "succeeded"
    kinds: dict[str, set[str]] = {}
    ours: set[str] = set()

    def all_arrived() -> bool:
        for _, message in subscriber.take(1, timeout=0.5):
            body = json.loads(base64.b64decode(message["body"]))
            for event in body if isinstance(body, list) else [body]:
                if "uuid" not in event:
                    continue  # a worker's own event (online, heartbeat)
                kinds.setdefault(event["uuid"], set()).add(event["type"])
                if run.id in str(event.get("kwargs")):
                    ours.add(event["uuid"])
        return len(ours) == 6 and all(len(kinds[uuid]) == 4 for uuid in ours)

    wait_for(all_arrived, timeout=30, interval=0, what="the laps' task events")
    assert all(kinds[uuid] == {"task-sent", "task-received", "task-started", "task-succeeded"}
               for uuid in ours), kinds
