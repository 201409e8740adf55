"""``tasks.popheld`` on a real Redis: a busy channel takes its next message
and records it unacked in one script, writing exactly what kombu's own
``QoS.append`` writes, so everything kombu does with that record (ack, the
requeue of a reject, the restore after the visibility timeout) still works;
an empty queue, and a server that refuses scripts, fall back to kombu's
blocking ``BRPOP``."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue

from tasks.popheld import MAX_BATCH, PopHeldChannel
from tests.integration.brokers import broker_app, redis_user_denied

pytestmark = pytest.mark.integration


def _queue() -> Queue:
    name = f"ph-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name), routing_key=name)


def _publish(conn: Connection, queue: Queue, *bodies: Any) -> None:
    producer = Producer(conn.default_channel, serializer="json")
    for body in bodies:
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue])


def _take(conn: Connection, queue: Queue, n: int = 1) -> list[Any]:
    got: list[Any] = []
    with Consumer(conn.default_channel, [queue], callbacks=[lambda b, m: got.append(m)],
                  accept=["json"]):
        while len(got) < n:
            conn.drain_events(timeout=5)
    return got


def _held(plain: redis.Redis[bytes], tag: str) -> tuple[Any, float | None]:
    entry = plain.hget("unacked", tag)
    return (None if entry is None else json.loads(entry)), plain.zscore("unacked_index", tag)


def test_a_busy_delivery_is_held_as_kombu_holds_it(app: Celery, broker_url: str,
                                                   plain: redis.Redis[bytes]) -> None:
    """The same record under the same tag as kombu's stock channel writes."""
    ours_q, stock_q = _queue(), _queue()
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        assert isinstance(channel, PopHeldChannel)
        _publish(conn, ours_q, {"n": 1})
        (ours,) = _take(conn, ours_q)
        assert channel._pop_next, "the delivery came from the script"
        with Connection(broker_url) as stock_conn:
            assert not isinstance(stock_conn.default_channel, PopHeldChannel)
            _publish(stock_conn, stock_q, {"n": 1})
            (stock,) = _take(stock_conn, stock_q)
            ours_entry, ours_score = _held(plain, ours.delivery_tag)
            stock_entry, stock_score = _held(plain, stock.delivery_tag)
            assert ours_entry == [ours._raw, ours_q.name, ours_q.name]
            assert stock_entry == [stock._raw, stock_q.name, stock_q.name]
            assert ours_score is not None and stock_score is not None
            assert abs(ours_score - time.time()) < 60
            stock.ack()
        ours.ack()
    assert _held(plain, ours.delivery_tag) == (None, None)


def test_a_held_message_is_requeued_by_a_reject_and_restored_after_its_timeout(
        app: Celery, plain: redis.Redis[bytes]) -> None:
    queue = _queue()
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        _publish(conn, queue, {"n": 1})
        (first,) = _take(conn, queue)
        first.requeue()  # what task_reject_on_worker_lost does
        assert plain.llen(queue.name) == 1 and _held(plain, first.delivery_tag) == (None, None)
        (again,) = _take(conn, queue)
        assert again.payload == {"n": 1} and again.delivery_info["redelivered"]
        # A worker that died holding it: its record ages past the visibility timeout.
        plain.zadd("unacked_index", {again.delivery_tag: 0})
        channel.qos.restore_visible(num=100)
        assert plain.llen(queue.name) == 1 and _held(plain, again.delivery_tag) == (None, None)
        (restored,) = _take(conn, queue)
        assert restored.payload == {"n": 1}
        restored.ack()
    assert plain.hget("unacked", restored.delivery_tag) is None


def _drain_once(conn: Connection, queue: Queue, prefetch: int | None,
                callback: Any = None) -> list[Any]:
    """The messages one ``drain_events`` delivers: one script call's."""
    got: list[Any] = []
    with Consumer(conn.default_channel, [queue], prefetch_count=prefetch, accept=["json"],
                  callbacks=[callback or (lambda b, m: got.append(m))]):
        conn.drain_events(timeout=5)
    return got


def test_a_backlog_is_taken_in_one_call_as_far_as_the_prefetch_has_room(
        app: Celery, plain: redis.Redis[bytes]) -> None:
    """Five queued, room for three: one call takes the oldest three, in
    order, each held as kombu holds it; the other two stay queued."""
    queue = _queue()
    with app.connection_for_write() as conn:
        _publish(conn, queue, *({"n": n} for n in range(5)))
        got = _drain_once(conn, queue, prefetch=3)
        assert [m.payload for m in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert plain.llen(queue.name) == 2
        for message in got:
            assert _held(plain, message.delivery_tag)[0] == [message._raw, queue.name, queue.name]
            message.ack()
        assert [m.payload for m in _drain_once(conn, queue, prefetch=3)] == [{"n": 3}, {"n": 4}]


def test_without_a_prefetch_limit_one_call_takes_at_most_max_batch(
        app: Celery, plain: redis.Redis[bytes]) -> None:
    queue = _queue()
    with app.connection_for_write() as conn:
        _publish(conn, queue, *({"n": n} for n in range(MAX_BATCH + 3)))
        got = _drain_once(conn, queue, prefetch=None)
        assert [m.payload["n"] for m in got] == list(range(MAX_BATCH))
        assert plain.llen(queue.name) == 3
        for message in got:
            message.ack()


def test_messages_taken_but_not_delivered_go_back_to_the_head_of_the_queue(
        app: Celery, plain: redis.Redis[bytes]) -> None:
    """The delivery of the second of four raises: the third and fourth go back
    at the head of the list in their order, without their unacked records;
    the second stays held, as kombu leaves a delivery that raised."""
    queue = _queue()
    seen: list[Any] = []

    def fail_on_the_second(body: Any, message: Any) -> None:
        seen.append(message)
        if body == {"n": 1}:
            raise RuntimeError("delivery failed")

    with app.connection_for_write() as conn:
        _publish(conn, queue, *({"n": n} for n in range(4)), {"n": "later"})
        with pytest.raises(RuntimeError, match="delivery failed"):
            _drain_once(conn, queue, prefetch=4, callback=fail_on_the_second)
        assert [m.payload for m in seen] == [{"n": 0}, {"n": 1}]
        assert _held(plain, seen[1].delivery_tag)[0] is not None
        held_here = [json.loads(e) for e in plain.hvals("unacked")]
        assert sorted(m[0]["properties"]["delivery_tag"] for m in held_here
                      if m[2] == queue.name) == sorted(m.delivery_tag for m in seen)
        for message in seen:
            message.ack()
        again = _drain_once(conn, queue, prefetch=2)
        assert [m.payload for m in again] == [{"n": 2}, {"n": 3}]
        assert all(m.delivery_info["redelivered"] for m in again)
        for message in again:
            message.ack()
        assert [m.payload for m in _drain_once(conn, queue, prefetch=1)] == [{"n": "later"}]


def test_an_empty_queue_waits_in_kombus_brpop(app: Celery, broker_url: str,
                                              plain: redis.Redis[bytes]) -> None:
    """The script finds nothing and the channel blocks in BRPOP; the message
    that wakes it is recorded by kombu's own two steps, and the next
    delivery tries the script again."""
    queue = _queue()
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        got: list[Any] = []
        with Consumer(channel, [queue], callbacks=[lambda b, m: got.append(m)],
                      accept=["json"]):
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=0.3)
            assert not channel._pop_next
            with Connection(broker_url) as other:
                _publish(other, queue, {"n": 2})
            while not got:
                conn.drain_events(timeout=5)
        assert channel._pop_next
        (message,) = got
        assert _held(plain, message.delivery_tag)[0] == [message._raw, queue.name, queue.name]
        message.ack()
    assert _held(plain, message.delivery_tag) == (None, None)


def test_a_server_that_refuses_scripts_gets_kombus_brpop(broker_url: str, plain: redis.Redis[bytes],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A Redis user without ``@scripting``: the script is refused before it
    pops anything, the channel says so once and takes the message by BRPOP."""
    queue = _queue()
    with redis_user_denied(plain, broker_url, "-@scripting") as url:
        app = broker_app(url)
        try:
            with app.connection_for_write() as conn:
                channel: Any = conn.default_channel
                _publish(conn, queue, {"n": 3}, {"n": 4})
                with caplog.at_level("WARNING", logger="tasks.popheld"):
                    got = _take(conn, queue, 2)
                assert [m.payload for m in got] == [{"n": 3}, {"n": 4}]
                assert channel._pop_refused and not channel._pop_next
                refusals = [r for r in caplog.records
                            if "refused the pop-and-hold" in r.getMessage()]
                assert len(refusals) == 1
                for message in got:
                    assert _held(plain, message.delivery_tag)[0] == [message._raw, queue.name,
                                                                     queue.name]
                    message.ack()
        finally:
            app.close()
