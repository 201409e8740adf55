"""``tasks.broker`` on a real Redis: a channel builds one redis-py client, not
one per publish and ack, and everything kombu does with it still holds (the
message lands, the unacked bookkeeping of ``acks_late`` fills and empties, a
pool rebuilt after fork gets a client of its own), while the connection still
reads as ``redis://`` to whoever renders it (Flower, the worker's banner)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.common import ignore_errors

from tasks.broker import SharedClientTransport

pytestmark = pytest.mark.integration


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every ``redis.Redis`` the code under test builds."""
    built = [0]
    init = redis.Redis.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def _publish(conn: Connection, queue: Queue, n: int) -> None:
    producer = Producer(conn.default_channel, serializer="json")
    for i in range(n):
        producer.publish({"i": i}, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue])


def test_the_apps_connections_share_clients_and_still_read_as_redis(app: Celery) -> None:
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, SharedClientTransport)
        assert conn.as_uri().startswith("redis://")
    pooled: Any = app.pool.acquire(block=True)  # every send_task goes through these
    try:
        assert isinstance(pooled.transport, SharedClientTransport)
        assert pooled.as_uri().startswith("redis://")
    finally:
        pooled.release()


def test_the_app_runs_on_this_transport() -> None:
    from tasks.celeryapp import make_app

    assert make_app().amqp_cls == "tasks.broker:LapAMQP"


def test_other_transports_are_kombus_own(app: Celery) -> None:
    conn = app.connection_for_write("memory://")
    assert not isinstance(conn.transport, SharedClientTransport)
    conn.release()


def test_publishes_and_acks_reuse_one_client(app: Celery, broker_url: str,
                                            clients_built: list[int]) -> None:
    """Twenty publishes, deliveries and acks on one channel build one client
    (kombu's stock channel builds one for each of those sixty steps), and the
    ack emulation still records each delivery as unacked until its ack."""
    name = f"bc-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    plain = redis.Redis.from_url(broker_url)
    with app.connection_for_write() as conn:
        conn.default_channel  # noqa: B018 (opened before counting)
        before = clients_built[0]
        _publish(conn, queue, 20)
        assert plain.llen(name) == 20
        got: list[Any] = []
        with Consumer(conn.default_channel, [queue], callbacks=[lambda b, m: got.append(m)],
                      accept=["json"]):
            while len(got) < 20:
                conn.drain_events(timeout=5)
        assert plain.hlen("unacked") >= len(got)
        for message in got:
            message.ack()
        built = clients_built[0] - before
    unacked = [k for k in plain.hkeys("unacked")
               if any(k.decode() == m.delivery_tag for m in got)]
    assert unacked == [] and sorted(m.payload["i"] for m in got) == list(range(20))
    # The consumer's BRPOP uses kombu's own long-lived client; publish, QoS
    # and ack steps share one more.
    assert built <= 2, f"{built} redis clients for 20 publishes, deliveries and acks"
    plain.close()


def test_a_rebuilt_pool_gets_its_own_client(app: Celery, broker_url: str) -> None:
    """After a fork kombu drops the channel's pool (``_disconnect_pools``):
    the kept client must not outlive it."""
    name = f"bc-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    plain = redis.Redis.from_url(broker_url)
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        with channel.conn_or_acquire() as first:
            assert first.connection_pool is channel.pool
        channel._disconnect_pools()
        with channel.conn_or_acquire() as second:
            assert second is not first and second.connection_pool is channel.pool
        _publish(conn, queue, 1)
    assert plain.llen(name) == 1
    plain.delete(name)
    plain.close()


def test_a_channel_closed_after_its_connection_was_collected_leaves_the_worker_up(
        app: Celery, broker_url: str, plain: redis.Redis[bytes]) -> None:
    """Celery's consumer, on a broker error, first collects its connection
    (which detaches the transport, and whose close of the channel can time
    out halfway while Redis restarts) and then closes it again under
    ``ignore_errors``. That second close restores the unacked deliveries
    through a pool the detached transport cannot build: it must fail as a
    connection error, which Celery ignores, not as the AttributeError that
    stopped the worker in the chaos suite."""
    name = f"bc-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    conn = app.connection_for_write()
    channel: Any = conn.default_channel
    _publish(conn, queue, 1)
    got: list[Any] = []
    with Consumer(channel, [queue], callbacks=[lambda b, m: got.append(m)], accept=["json"]):
        while not got:
            conn.drain_events(timeout=5)
    channel._disconnect_pools()  # the half-done first close
    conn._do_close_transport()  # collect() detaches the transport
    ignore_errors(conn, conn.close)  # raises anything but a connection error
    assert plain.hexists("unacked", got[0].delivery_tag), "kept for the visibility restore"
    plain.hdel("unacked", got[0].delivery_tag)
    plain.zrem("unacked_index", got[0].delivery_tag)
