"""The Redis transport our Celery app talks through: kombu's own, except that a
channel keeps one redis-py client instead of building one per command.

kombu's Redis channel hands every publish and every ``acks_late`` bookkeeping
step (``QoS.append`` on delivery, ``QoS.ack`` after the lap) a brand-new
``redis.Redis(connection_pool=...)``. Since redis-py 6 building one fills a
case-insensitive table of ~170 response callbacks: 86 µs of CPU on this
machine, about as much as the LPUSH it serves, four times a lap (issue 21
goal 2; BENCHMARKS.md, "The broker's clients, the lap cache miss and the
window's tokens"). A client that only borrows connections from the
channel's pool is thread-safe (redis-py's documented contract), so one per
channel and pool does the same work.

Everything else is kombu's: the same pool, the same commands, the same ack
emulation and visibility timeout that ``acks_late`` redelivery rests on,
except that a busy worker takes its next message and records it unacked in
one round trip (``tasks.popheld``). The
channel's pool is rebuilt after a fork or a close (``_disconnect_pools``); a
kept client whose ``connection_pool`` is not the channel's current one is
replaced, so it never outlives its pool.

It is installed through the app's ``amqp`` class (``LapAMQP``), not
``broker_transport``: a transport named by import path would also become the
connection URL's scheme (``as_uri()``, which Flower and the worker's banner
read), and kombu's own ``redis`` alias stays untouched for every other user
of kombu in the process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.app.amqp import AMQP
from kombu import Connection
from kombu.connection import ConnectionPool, PooledConnection
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps
from redis.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from tasks.eventpublish import UnawaitedPublisher
from tasks.popheld import PopHeldChannel

EVENT_EXCHANGE = "celeryev"
"""Celery's event exchange (``event_exchange``, set to this by the app): its
publishes do not wait for Redis's reply (``tasks.eventpublish``)."""

_events_made = threading.Lock()


class SharedClientChannel(PopHeldChannel):
    """kombu's Redis channel with one client per connection pool (and the
    delivery of ``tasks.popheld``, the task events of ``tasks.eventpublish``)."""

    _shared: Any = None
    _events: UnawaitedPublisher | None = None

    def _put_fanout(self, exchange: str, message: Any, routing_key: str, **kwargs: Any) -> None:
        if (exchange != EVENT_EXCHANGE or self.global_keyprefix
                or kwargs.get("_publish_batch") is not None):
            super()._put_fanout(exchange, message, routing_key, **kwargs)  # type: ignore[misc]
            return
        self.publish_event(exchange, routing_key, dumps(message))

    def publish_event(self, exchange: str, routing_key: str, payload: str) -> None:
        """``PUBLISH`` a message of Celery's event exchange, as kombu's
        ``_put_fanout`` would, without waiting for the reply
        (``tasks.eventpublish``). Raises redis-py's connection errors."""
        if self._events is None:
            with _events_made:
                if self._events is None:
                    self._events = UnawaitedPublisher(self._events_connection)
        topics = self._get_publish_topics(exchange, routing_key)  # type: ignore[attr-defined]
        self._events.publish(topics, payload)

    def _events_connection(self) -> AbstractConnection:
        # The pool's own class and arguments: same server, database, credentials, TLS.
        pool: Any = self.pool
        made: AbstractConnection = pool.connection_class(**pool.connection_kwargs)
        return made

    def _get_pool(self, asynchronous: bool = False) -> Any:
        # Celery's consumer, after a broker error, collects its connection
        # (detaching the transport) and closes it once more; that close
        # restores unacked deliveries through a new pool, which kombu would
        # build from the detached transport's client (None): an AttributeError
        # that stopped workers when Redis restarted. A connection error is
        # what that close ignores; the deliveries stay in Redis's unacked set
        # for its visibility restore, and the sweeper re-sends their laps.
        if self.connection.client is None:
            raise RedisConnectionError("the channel's connection was closed")
        return super()._get_pool(asynchronous)  # type: ignore[misc]

    def _disconnect_pools(self) -> None:
        # Closing, a fork or a lost connection: the events' connection goes too.
        events, self._events = self._events, None
        if events is not None:
            events.close()
        super()._disconnect_pools()  # type: ignore[misc]

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared
        if shared is None or shared.connection_pool is not self.pool:
            # Two threads racing here each build a valid client; the last one stays.
            shared = self._shared = self._create_client()  # type: ignore[attr-defined]
        yield shared


class SharedClientTransport(kombu_redis.Transport):
    """kombu's Redis transport on ``SharedClientChannel``."""

    Channel = SharedClientChannel


class _SharedClients:
    """Opens kombu's Redis transport as ``SharedClientTransport``; any other
    transport (``memory://`` in tests, Sentinel) is left as it is."""

    def get_transport_cls(self) -> type:
        found: type = super().get_transport_cls()  # type: ignore[misc]
        return SharedClientTransport if found is kombu_redis.Transport else found


class _PooledLapConnection(_SharedClients, PooledConnection):
    """A connection of the app's producer pool (every ``send_task``)."""


class _LapConnectionPool(ConnectionPool):
    def new(self) -> Connection:
        # As kombu's own ``new``; celery-types' stubs miss that a
        # ``PooledConnection`` is a ``Connection`` and takes its arguments.
        return _PooledLapConnection(  # type: ignore[return-value]
            self, **dict(self.connection._info(resolve=False)))


class LapConnection(_SharedClients, Connection):
    """A kombu ``Connection`` whose Redis channels keep one client, and so
    do the connections of its pool (kombu's ``Pool`` would build plain
    ``PooledConnection`` objects)."""

    def Pool(self, limit: int | None = None, **kwargs: Any) -> ConnectionPool:
        return _LapConnectionPool(self, limit=limit, **kwargs)


class LapAMQP(AMQP):
    """Celery's broker glue with ``LapConnection`` for every connection the
    app opens (worker consumer, producer pool, Flower's inspection)."""

    Connection = LapConnection
    BrokerConnection = LapConnection


__all__ = ["LapAMQP", "LapConnection", "SharedClientChannel", "SharedClientTransport"]
