"""Taking a lap message off Redis and into kombu's unacked set in one round trip.

kombu's Redis transport delivers a message in two steps: ``BRPOP`` takes it
off the queue, then ``QoS.append`` writes it to the ``unacked`` hash and the
``unacked_index`` sorted set (a ``MULTI`` pipeline) so that it can be
restored if the worker dies before acking it (``acks_late``, the visibility
timeout, ``task_reject_on_worker_lost``, a soft shutdown's requeue). That
second round trip and its pipeline cost 0.1-0.3 ms of a 3.5-4 ms lap through
Celery (issue 21 goal 2; BENCHMARKS.md, "The redaction screen, a delivery in
one round trip, and where the threads hand-off goes"), and between the two
steps a worker that dies has the message in neither place.

``POP_AND_HOLD`` does both at once, atomically on the server: pop from the
first non-empty queue list (``BRPOP``'s order) and write the very entry
``QoS.append`` would write, ``[payload, exchange, routing_key]`` under the
message's delivery tag, with the time as its score. It takes as many
messages as the channel's prefetch has room for (at most ``MAX_BATCH``) in
that one call: under a backlog a threads worker's consumer, one thread among
hundreds waiting for the GIL, otherwise got one message per turn, and laps
waited in the list while their worker had threads free (BENCHMARKS.md,
"Taking a backlog in one round trip"). A message taken but not delivered (a
delivery that raised before it) is put back at the head of its list at once.
Everything that reads those keys (kombu's restore of messages past the
visibility timeout, ``restore_by_tag`` on a reject, the requeue at shutdown,
``QoS.ack``) is kombu's own and unchanged. A script cannot block, so it is
tried first only right after a delivery, when the worker is busy and the
next message is likely there; on a miss the channel sends kombu's own
blocking ``BRPOP``, whose message takes kombu's two steps, so an idle worker
costs what it cost before. A prefixed
keyspace (``global_keyprefix``) and a transport without ack emulation keep
kombu's path throughout, and so does a channel whose server refused the
script (an ACL without ``@scripting``), after one warning.

``HeldQoS`` also keeps the process's held delivery tags, so that a lap
running in this process (threads, solo) can ack its own delivery in the
round trip that sends its successor (``tasks.lapsend``); the consumer's own
ack of such a tag then only forgets it.
"""

from __future__ import annotations

import logging
import os
from queue import Empty
from time import monotonic, time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

POP_AND_HOLD = """
local out = {}
local room = tonumber(ARGV[2])
for i = 3, #KEYS do
  while #out < room * 3 do
    local item = redis.call('RPOP', KEYS[i])
    if not item then break end
    local ok, payload = pcall(cjson.decode, item)
    local props = ok and type(payload) == 'table' and payload['properties']
    local info = type(props) == 'table' and props['delivery_info']
    local tag = type(props) == 'table' and props['delivery_tag']
    local held = 0
    if type(info) == 'table' and type(tag) == 'string' then
      redis.call('ZADD', KEYS[2], ARGV[1], tag)
      redis.call('HSET', KEYS[1], tag, '[' .. item .. ',' .. cjson.encode(info['exchange'])
                 .. ',' .. cjson.encode(info['routing_key']) .. ']')
      held = 1
    end
    local n = #out
    out[n + 1] = KEYS[i]
    out[n + 2] = item
    out[n + 3] = held
  end
end
if #out == 0 then
  return false
end
return out
"""
"""KEYS: the unacked hash, the unacked index, then the queue lists in
``BRPOP``'s order; ARGV: the score (now), then how many messages at most.
Returns ``[list, message, held, ...]`` for each message taken, in the order
taken, ``held`` 0 when the message is not kombu's shape (kombu's
``QoS.append`` then writes what it can), or nil when every list is empty."""

#: The most messages one script call takes: it bounds the time the script
#: holds the Redis server (each message is a pop, a JSON decode and two writes)
#: and the reply's size.
MAX_BATCH = 64


_held: dict[str, bool] = {}
"""Delivery tags the consumers of this process hold unacked, each ``True``
once a successor's send removed its unacked records (``tasks.lapsend``)."""


# A forked pool child holds nothing: its parent's consumer does.
os.register_at_fork(after_in_child=_held.clear)


def held_here(tag: str) -> bool:
    """Whether a consumer of this process holds the delivery ``tag`` unacked."""
    return tag in _held


def acked_by_successor(tag: str) -> None:
    """Note that the delivery's unacked records are gone from Redis, removed
    in the round trip that sent its successor: its ack only forgets it."""
    if tag in _held:
        _held[tag] = True


class HeldQoS(kombu_redis.QoS):
    """kombu's Redis QoS, which does not write again what ``POP_AND_HOLD``
    wrote for the message being delivered, nor remove again what a
    successor's send removed (``tasks.lapsend``)."""

    channel: PopHeldChannel

    def append(self, message: Any, delivery_tag: str) -> None:
        _held[delivery_tag] = False
        if delivery_tag == self.channel.held_tag:
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if _held.pop(delivery_tag, False):
            virtual.QoS.ack(self, delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        # A successor-acked delivery has nothing left to restore: its successor is queued.
        _held.pop(delivery_tag, None)
        super().reject(delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any = None) -> None:
        for tag in self._delivered or ():
            _held.pop(tag, None)
        super().restore_unacked(client)


class PopHeldChannel(kombu_redis.Channel):
    """kombu's Redis channel, trying ``POP_AND_HOLD`` before a ``BRPOP``."""

    QoS = HeldQoS
    #: The tag of the message being delivered, when ``POP_AND_HOLD`` holds it.
    held_tag: str | None = None
    _pop_next = True
    _popping = False
    _pop_refused = False

    def _brpop_start(self, timeout: float | None = None) -> None:
        ch: Any = self  # kombu's private members, which its type stubs do not list
        if (not self._pop_next or self._pop_refused or self.global_keyprefix
                or not self.ack_emulation):
            super()._brpop_start(timeout)  # type: ignore[misc]
            return
        queues = ch._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        lists = [ch._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        connection = self.client.connection
        ch._in_poll = connection
        ch._brpop_sent_at = monotonic()
        self._popping = True
        room = self.qos.can_consume_max_estimate()
        connection.send_command("EVAL", POP_AND_HOLD, 2 + len(lists), self.unacked_key,
                                self.unacked_index_key, *lists, time(),
                                MAX_BATCH if room is None else max(1, min(room, MAX_BATCH)))

    def _brpop_read(self, **options: Any) -> bool:
        ch: Any = self
        if not self._popping:
            # kombu's BRPOP reply; Empty when it timed out.
            delivered: bool = super()._brpop_read(**options)  # type: ignore[misc]
            self._pop_next = not self._pop_refused
            return delivered
        self._popping = False
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "EVAL", **options)
            except ch.connection_errors:
                self.client.connection.disconnect()  # as kombu's BRPOP: reconnect next time
                raise
            except ResponseError as e:  # a server that refuses the script: kombu's path
                log.warning("Redis refused the pop-and-hold script (%s); using BRPOP", e)
                self._pop_next = False
                self._pop_refused = True
                raise Empty() from e
            if not reply:
                self._pop_next = False  # every list was empty: block in BRPOP
                raise Empty()
            taken = [reply[at:at + 3] for at in range(0, len(reply), 3)]
            for at, (found, item, held) in enumerate(taken):
                try:
                    self._deliver_taken(bytes_to_str(found).rsplit(self.sep, 1)[0], item, held)
                except BaseException:
                    self._give_back(taken[at + 1:])
                    raise
            return True
        finally:
            ch._in_poll = None
            ch._flush_brpop_reauth()

    def _deliver_taken(self, queue: str, item: bytes, held: int) -> None:
        ch: Any = self
        ch._queue_cycle.rotate(queue)
        payload = loads(bytes_to_str(item))
        self.held_tag = payload["properties"]["delivery_tag"] if held else None
        try:
            self.connection._deliver(payload, queue)
        finally:
            self.held_tag = None

    def _give_back(self, taken: list[list[Any]]) -> None:
        """Put messages the script took but this channel never delivered back
        at the head of their lists, in their order, and drop their unacked
        records (kombu's ``restore_by_tag``): else they would wait out the
        visibility timeout, since only delivered tags are restored at shutdown."""
        qos: Any = self.qos  # HeldQoS, whose stubs miss the Redis QoS's members
        for found, item, held in reversed(taken):
            if held:
                qos.restore_by_tag(loads(bytes_to_str(item))["properties"]["delivery_tag"])
            else:
                self.client.rpush(found, item)


__all__ = ["POP_AND_HOLD", "HeldQoS", "PopHeldChannel", "acked_by_successor", "held_here"]
