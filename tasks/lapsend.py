"""Sending a lap message in one Redis round trip that also acks the lap that sent it.

``Celery.send_task`` spends about 280 µs of CPU on a lap message whose LPUSH
costs about 95 (``python -m bench.lap_send``; BENCHMARKS.md, "A lap sent in
one command, its ack in the same round trip"): the registry and router
lookups, a producer taken from the pool and given back, ``Connection.ensure``'s
retry wrapper, the entity revival and kombu's generic publish, on every lap,
on the lap's critical path. ``LapSender`` builds the same message with
Celery's own protocol code (``AMQP.as_task_v2``, kombu's serializer and body
encoding) and pushes it with one command, for about 170 µs;
``tests/integration/test_lap_send.py`` checks it against ``send_task``'s,
field by field.

And the lap that sends its successor is done: its checkpoint is committed
(``Runtime.send_all`` sends only after that), and the successor carries the
run on. So when the consumer that holds this lap's delivery runs in this
process (the threads and solo pools; ``tasks.popheld`` knows its tags), the
same ``MULTI`` also removes the delivery's unacked records, kombu's own
``QoS.ack`` minus the round trip, and the consumer's later ack only forgets
the tag. A crash before the ``EXEC`` leaves both undone (the lap is
redelivered, its claim finds the lap committed, the sweeper re-sends the
successor if it is overdue); after it, both are done. Under prefork the lap
runs in a child while the parent holds the delivery, so the child sends
without acking and the parent acks as before.

Celery's path stays wherever this one would differ from it: a transport
other than ``tasks.broker``'s Redis channel (``memory://`` in unit tests,
Sentinel), a prefixed keyspace (``global_keyprefix``), a queue with an
expiry, and any receiver of the publish signals (an OpenTelemetry
instrumentation injecting trace headers, say). With task events on, the
``task-sent`` event Flower reads is the message ``send_task``'s event
dispatcher would publish, ``PUBLISH``ed without waiting for the reply
(``tasks.eventpublish``; ``python -m bench.lap_send --events``: 241 -> 163 µs
of CPU a send).
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

from celery import Celery, signals
from celery.utils.nodenames import anon_nodename
from kombu import serialization
from kombu.entity import maybe_delivery_mode
from kombu.utils.json import dumps
from kombu.utils.uuid import uuid
from redis.exceptions import RedisError

from agent_worker.constants import LAP_TASK_NAME
from store.base import DueLap
from tasks.broker import SharedClientChannel
from tasks.popheld import acked_by_successor, held_here

log = logging.getLogger(__name__)


def lap_kwargs(lap: DueLap) -> dict[str, Any]:
    """The lap task's kwargs: ``run_id`` and ``lap`` travel as kwargs so
    Flower's ``kwargs:run_id=...`` search finds a run's laps."""
    return {"run_id": lap.run_id, "lap": lap.lap}


def agent_header(lap: DueLap) -> dict[str, str]:
    """The agent rides in a header, not the task name (which would explode
    Flower's Prometheus label sets)."""
    return {"agent": f"{lap.agent_name}@{lap.agent_version}"}


def _publish_observed() -> bool:
    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers
                or signals.task_sent.receivers)


def _own_delivery(task: Any, lap: DueLap) -> str | None:
    """The delivery tag of ``task``, the worker task running in this thread,
    when it is a lap whose successor is ``lap`` (same run, a later or the same
    lap) and a consumer of this process holds that delivery; else ``None``."""
    if task is None or task.name != LAP_TASK_NAME:
        return None
    request = task.request
    kwargs = request.kwargs or {}
    current = kwargs.get("lap")
    if kwargs.get("run_id") != lap.run_id or not isinstance(current, int) or lap.lap < current:
        return None
    tag = (request.properties or {}).get("delivery_tag")
    return tag if isinstance(tag, str) and held_here(tag) else None


class LapSender:
    """Sends lap messages for ``app`` through a producer of its pool, as
    ``send_task`` does (``broker_pool_limit`` connections at most, a thread
    waits for one); ``send`` returns ``False`` where ``send_task`` must send
    instead."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._origin = ""
        self._pid = 0

    def _sender_name(self) -> str:
        # As Celery names a sender: its pid and host (a forked child is another).
        if self._pid != os.getpid():
            self._origin, self._pid = anon_nodename(), os.getpid()
        return self._origin

    def send(self, lap: DueLap, queue: str) -> bool:
        if _publish_observed():
            return False
        with self.app.producer_pool.acquire(block=True) as producer:
            channel = producer.channel
            ch: Any = channel  # kombu's private members, which its type stubs do not list
            if (type(channel) is not SharedClientChannel or channel.global_keyprefix
                    or queue in ch._expires):
                return False
            self._push(lap, queue, channel)
        return True

    def _push(self, lap: DueLap, queue: str, channel: SharedClientChannel) -> None:
        ch: Any = channel  # kombu's private members, which its type stubs do not list
        # Any: celery-types' stubs miss that send_task itself passes ignore_result=None.
        app, amqp = self.app, cast(Any, self.app.amqp)
        kwargs, task_id = lap_kwargs(lap), uuid()
        parent = app.current_worker_task
        headers, properties, body, sent_event = amqp.as_task_v2(
            task_id, LAP_TASK_NAME, kwargs=kwargs, reply_to=app.thread_oid,
            create_sent_event=app.conf.task_send_sent_event,
            root_id=(parent.request.root_id or parent.request.id) if parent else None,
            parent_id=parent.request.id if parent else None,
            argsrepr="()", kwargsrepr=repr(kwargs), origin=self._sender_name(),
            ignore_result=None)
        headers.update(agent_header(lap))
        properties.update(
            argsrepr="()", kwargsrepr=repr(kwargs),
            delivery_mode=maybe_delivery_mode(app.conf.task_default_delivery_mode))
        message = _on_the_wire(channel, serialization.dumps(
            body, serializer=app.conf.task_serializer), headers, properties, exchange="",
            routing_key=queue)
        key = ch._q_for_pri(queue, channel.default_priority)
        tag = _own_delivery(parent, lap) if channel.ack_emulation else None
        with channel.conn_or_acquire() as client:
            if tag is None:
                client.lpush(key, message)
            else:
                with client.pipeline(transaction=True) as pipe:
                    # kombu's own ack of ``tag`` (QoS.ack's ZREM and HDEL), queued after the push
                    ch.qos._remove_from_indices(tag, pipe.lpush(key, message)).execute()
                acked_by_successor(tag)
        if sent_event is not None:
            self._publish_sent(channel, sent_event, queue)

    def _publish_sent(self, channel: SharedClientChannel, fields: dict[str, Any],
                      queue: str) -> None:
        """``task-sent`` as ``send_task``'s event dispatcher would publish it,
        without waiting for the reply (``tasks.eventpublish``). Not in the
        push's ``MULTI``: an ACL that refuses ``PUBLISH`` would abort the push
        with it. A failure loses the event, as that dispatcher's buffer,
        which nothing flushes, loses it; never the lap, already pushed."""
        # Any: the dispatcher send_task publishes with is private to Celery's AMQP.
        dispatcher = cast(Any, self.app.amqp)._event_dispatcher
        fields.update(queue=queue, exchange="", routing_key=queue)
        event = dispatcher._prepare_event("task-sent", fields)
        exchange, routing_key = dispatcher.exchange.name, "task.sent"
        message = _on_the_wire(
            channel, serialization.dumps(event, serializer=dispatcher.serializer),
            dispatcher.headers, {"delivery_mode": maybe_delivery_mode(dispatcher.delivery_mode)},
            exchange=exchange, routing_key=routing_key)
        try:
            channel.publish_event(exchange, routing_key, message)
        except RedisError as e:
            log.warning("task-sent of task %s not published: %s", fields.get("uuid"), e)


def _on_the_wire(channel: SharedClientChannel, serialized: tuple[str, str, Any],
                 headers: dict[str, Any], properties: dict[str, Any], *, exchange: str,
                 routing_key: str) -> str:
    """A message as kombu's Redis channel writes it: ``Producer.publish``'s
    envelope, then ``basic_publish``'s body encoding and delivery tag."""
    content_type, encoding, data = serialized
    encoded, body_encoding = cast(Any, channel).encode_body(data, channel.body_encoding)
    properties.update(delivery_info={"exchange": exchange, "routing_key": routing_key},
                      priority=channel.default_priority, body_encoding=body_encoding,
                      delivery_tag=uuid())
    return dumps({"body": encoded, "content-encoding": encoding, "content-type": content_type,
                  "headers": headers, "properties": properties})


__all__ = ["LapSender", "agent_header", "lap_kwargs"]
