"""Task events published without waiting for Redis's reply.

With task events on (Flower's task views need them, and they are on by
default) every lap publishes four: ``task-sent`` from the lap that sends it,
then ``task-received``, ``task-started`` and ``task-succeeded`` from the worker
that runs it. kombu sends each ``PUBLISH`` and waits for its reply, a round
trip of its own; the reply is only the number of subscribers, which nobody
reads. Under the threads pool the consumer's thread waits on those round
trips in series with the next delivery, and the lap's own thread waits on
``task-sent``'s: task events cost a threads worker 0.8 ms of a 3.3 ms lap,
half of it waiting (BENCHMARKS.md, "Task events without the wait").

``UnawaitedPublisher`` writes the same ``PUBLISH`` (the payload and topics
kombu's ``_put_fanout`` builds) on a connection of its own and reads the
replies later, in batches. What can be observed does not change: Redis
pub/sub delivers an event to whoever is subscribed when it arrives and to
nobody else, with or without the wait. A connection that is already broken
still raises on the write, as kombu's publish raised, so Celery's dispatcher
keeps the event and sends it again on its next flush; a server that closed
an idle connection is found by a look at the socket before the first write
after a quiet second. An error reply (an ACL that forbids ``PUBLISH``, say)
arrives with a later batch and is logged, not raised: the event is lost, as
kombu's caller would have lost it (Celery's dispatcher buffers an event only
when the connection fails).

Only the event exchange takes this path (``tasks.broker``): remote-control
broadcasts keep kombu's awaited publish, so a refused command is an error at
once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from time import monotonic
from typing import Any

from redis.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

REPLIES_OWED_AT_MOST = 64
"""Replies left unread before a publish reads them all (they arrived long
ago, so this read does not wait): a few hundred bytes in the socket buffer."""

QUIET_SECONDS = 1.0
"""After this long without a publish, the connection is looked at before the
next one, so an event is not written into a socket the server has closed."""


class UnawaitedPublisher:
    """``PUBLISH`` on one connection whose replies are read later; thread-safe.

    ``connect`` makes the connection (the channel's pool's class and
    arguments, so the same server, database, credentials and TLS). In a
    forked child the parent's connection is left alone and another is made.
    """

    def __init__(self, connect: Callable[[], AbstractConnection]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._connection: AbstractConnection | None = None
        self._pid = 0
        self._owed = 0
        self._last = 0.0

    def publish(self, topics: Iterable[str], payload: str) -> None:
        """Write one ``PUBLISH`` of ``payload`` per topic. Raises redis-py's
        ``ConnectionError``/``TimeoutError`` when the write fails."""
        with self._lock:
            connection = self._current()
            commands = [("PUBLISH", topic, payload) for topic in topics]
            if self._owed >= REPLIES_OWED_AT_MOST:
                self._collect(connection, wait=True)
            elif monotonic() - self._last > QUIET_SECONDS:
                self._collect(connection, wait=False)
            # No health check: its PING would read a reply owed to a PUBLISH.
            packed: Any = connection.pack_commands(commands)  # bytes; the stubs say str
            connection.send_packed_command(packed, check_health=False)
            self._owed += len(commands)
            self._last = monotonic()

    def close(self) -> None:
        """Disconnect (the channel is closing). The replies still owed are
        dropped unread; redis-py leaves a forked parent's socket alone."""
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.disconnect()

    def _current(self) -> AbstractConnection:
        if self._connection is None or self._pid != os.getpid():
            connection = self._connect()
            connection.register_connect_callback(self._on_connect)
            self._connection, self._pid, self._owed = connection, os.getpid(), 0
        return self._connection

    def _on_connect(self, _connection: AbstractConnection) -> None:
        # A new socket: the replies owed on the old one went with it.
        self._owed = 0

    def _collect(self, connection: AbstractConnection, *, wait: bool) -> None:
        """Read the replies owed: all of them (``wait``), or those already
        here. A connection found closed, or sending what nobody asked for, is
        dropped here, before anything is written into it; the next write
        reconnects."""
        try:
            while self._owed if wait else connection.can_read(timeout=0):
                if not self._owed:
                    raise RedisConnectionError("a reply nobody asked for")
                self._owed -= 1
                try:
                    connection.read_response()
                except ResponseError as e:
                    log.warning("Redis refused a task event: %s", e)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            connection.disconnect()
            self._owed = 0


__all__ = ["UnawaitedPublisher"]
