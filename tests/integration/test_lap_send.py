"""``tasks.lapsend`` on a real Redis: the lap message it pushes is the one
``send_task`` would have published, field by field, task-sent event included;
a receiver of the publish signals gets Celery's own path; and a lap that sends
its successor while its own delivery is held in this process acks that
delivery in the same round trip, so the consumer's ack touches Redis no more
(a forked pool child, which holds nothing, never does), while a threads-pool
worker runs laps that way, each committed once, nothing left unacked."""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import celery._state
import pytest
import redis
from celery import Celery, signals
from kombu import Consumer, Queue

import tasks.lap  # noqa: F401  (registers the lap task with every app)
from agent_worker.api import AgentWorker
from agent_worker.constants import LAP_TASK_NAME
from store.base import DueLap
from tasks.broker import LapAMQP
from tasks.dispatch import CeleryDispatcher
from tasks.lapsend import LapSender
from tasks.popheld import held_here
from tasks.routing import lap_queue
from tests.integration.brokers import EventWatcher, redis_user_denied
from tests.integration.test_lap_loop import assert_laps_exactly_once
from tests.support import Fleet

pytestmark = pytest.mark.integration

_FRESH = {("headers", "id"), ("headers", "root_id"), ("properties", "correlation_id"),
          ("properties", "delivery_tag")}
"""What differs between two sends of one lap by design: the ids."""


@pytest.fixture
def plain(broker_url: str) -> Iterator[redis.Redis[bytes]]:
    client = redis.Redis.from_url(broker_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _app(broker_url: str, *, events: bool) -> Celery:
    app = Celery(f"send-test-{uuid.uuid4().hex[:6]}", broker=broker_url, amqp=LapAMQP,
                 set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"],
                    task_send_sent_event=events)
    assert app.tasks[LAP_TASK_NAME] is not None  # the shared lap task, as a worker has it
    return app


def _pop(plain: redis.Redis[bytes], queue: str) -> dict[str, Any]:
    raw = plain.rpop(queue)
    assert raw is not None, f"nothing on {queue}"
    message: dict[str, Any] = json.loads(raw)
    return message


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(message))
    for part, key in _FRESH:
        assert out[part].pop(key)
    out["body"] = json.loads(base64.b64decode(out["body"]))
    return out


@pytest.mark.parametrize("events", [False, True])
def test_the_lap_message_is_the_one_send_task_publishes(broker_url: str,
                                                        plain: redis.Redis[bytes],
                                                        events: bool) -> None:
    app = _app(broker_url, events=events)
    watching = EventWatcher(plain, broker_url)
    lap = DueLap("rün-1", 7, "loop", "1")
    queue = lap_queue("loop", "1")
    try:
        assert LapSender(app).send(lap, queue)
        ours = _pop(plain, queue)
        kwargs = {"run_id": lap.run_id, "lap": lap.lap}
        app.send_task(LAP_TASK_NAME, kwargs=kwargs, queue=queue, headers={"agent": "loop@1"},
                      argsrepr="()", kwargsrepr=repr(kwargs), declare=[])
        celerys = _pop(plain, queue)
        sent = watching.take(2 if events else 0)
        assert watching.take(1, timeout=0.3) == [], "more events than send_task's"
    finally:
        watching.close()
        app.close()
    assert _comparable(ours) == _comparable(celerys)
    assert ours["headers"]["root_id"] == ours["headers"]["id"]
    if not events:
        assert sent == []
        return
    (my_topic, mine), (their_topic, theirs) = sent
    assert my_topic == their_topic
    mine, theirs = _event_comparable(mine), _event_comparable(theirs)
    assert mine["body"]["uuid"] == ours["headers"]["id"]
    for event in (mine["body"], theirs["body"]):
        assert event.pop("uuid") and event.pop("root_id") and event.pop("timestamp")
        assert event.pop("clock") > 0
    assert mine == theirs


def _event_comparable(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(message))
    assert out["properties"].pop("delivery_tag")
    out["body"] = json.loads(base64.b64decode(out["body"]))
    return out


def test_a_server_that_refuses_publish_still_gets_the_lap(broker_url: str,
                                                          plain: redis.Redis[bytes]) -> None:
    """An ACL without ``PUBLISH``: the lap is pushed (task-sent is lost, and
    logged when its reply is read), as when send_task's publish failed."""
    with redis_user_denied(plain, broker_url, "-publish") as url:
        app = _app(url, events=True)
        try:
            queue = lap_queue("loop", "1")
            assert LapSender(app).send(DueLap("r-nopub", 3, "loop", "1"), queue)
            assert _pop(plain, queue)["headers"]["kwargsrepr"] == repr(
                {"run_id": "r-nopub", "lap": 3})
        finally:
            app.close()


def test_many_threads_sending_at_once_share_the_apps_producer_pool(
        broker_url: str, plain: redis.Redis[bytes]) -> None:
    """More senders than ``broker_pool_limit`` connections (the IO-bound
    fleet's threads): each waits for a pooled connection, none is refused."""
    app = _app(broker_url, events=False)
    sender, queue = LapSender(app), lap_queue("loop", "1")
    refused: list[BaseException] = []

    def send_many(worker: int) -> None:
        try:
            for lap in range(20):
                assert sender.send(DueLap(f"run-{worker}", lap, "loop", "1"), queue)
        except BaseException as e:
            refused.append(e)

    threads = [threading.Thread(target=send_many, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    app.close()
    assert refused == [] and plain.llen(queue) == 60 * 20


def test_a_publish_signal_receiver_gets_celerys_own_path(broker_url: str,
                                                         plain: redis.Redis[bytes]) -> None:
    app = _app(broker_url, events=False)
    seen: list[str] = []

    def receiver(headers: dict[str, Any], **_: Any) -> None:
        headers["traceparent"] = "00-abc-def-01"
        seen.append(headers["task"])

    signals.before_task_publish.connect(receiver, weak=False)
    try:
        assert not LapSender(app).send(DueLap("r", 1, "loop", "1"), lap_queue("loop", "1"))
        CeleryDispatcher(app).send(DueLap("r", 1, "loop", "1"))
    finally:
        signals.before_task_publish.disconnect(receiver)
        app.close()
    assert seen == [LAP_TASK_NAME]
    assert _pop(plain, lap_queue("loop", "1"))["headers"]["traceparent"] == "00-abc-def-01"


class _Held:
    """One lap message delivered to a kombu consumer of this process and held
    unacked, and the lap task pushed as the thread's running worker task."""

    def __init__(self, app: Celery, lap: DueLap) -> None:
        self.app = app
        CeleryDispatcher(app).send(lap)
        self.conn = app.connection_for_read()
        self.channel: Any = self.conn.default_channel
        got: list[Any] = []
        queue = Queue(lap_queue(lap.agent_name, lap.agent_version))
        self.consumer = Consumer(self.channel, [queue],
                                 callbacks=[lambda body, message: got.append(message)],
                                 accept=["json"])
        self.consumer.consume()
        while not got:
            self.conn.drain_events(timeout=5)
        self.message = got[0]
        self.tag: str = self.message.delivery_tag
        self.task = app.tasks[LAP_TASK_NAME]
        self.task.push_request(kwargs=json.loads(self.message.body)[1], called_directly=False,
                               properties=self.message.properties, id=self.message.headers["id"])
        self.stack: Any = celery._state._task_stack  # type: ignore[attr-defined]
        self.stack.push(self.task)

    def close(self) -> None:
        self.stack.pop()
        self.task.pop_request()
        self.consumer.cancel()
        self.conn.release()


def test_a_lap_sending_its_successor_acks_its_own_delivery_in_that_round_trip(
        broker_url: str, plain: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(broker_url, events=False)
    held = _Held(app, DueLap("run-a", 3, "loop", "1"))
    try:
        assert held_here(held.tag)
        assert plain.hexists("unacked", held.tag) and plain.zscore("unacked_index", held.tag)
        # Not its successor (another run, an earlier lap): sent, and the lap still held.
        CeleryDispatcher(app).send(DueLap("run-b", 4, "loop", "1"))
        CeleryDispatcher(app).send(DueLap("run-a", 2, "loop", "1"))
        assert plain.hexists("unacked", held.tag)
        CeleryDispatcher(app).send(DueLap("run-a", 4, "loop", "1"))
        assert not plain.hexists("unacked", held.tag)
        assert plain.zscore("unacked_index", held.tag) is None
        queued = [json.loads(m) for m in plain.lrange(lap_queue("loop", "1"), 0, -1)]
        assert [json.loads(base64.b64decode(m["body"]))[1] for m in reversed(queued)] == [
            {"run_id": "run-b", "lap": 4}, {"run_id": "run-a", "lap": 2},
            {"run_id": "run-a", "lap": 4}]
        # The consumer's ack after the lap only forgets the delivery.
        qos = held.channel.qos
        monkeypatch.setattr(qos, "_remove_from_indices",
                            lambda *a, **k: pytest.fail("the ack went to Redis"))
        held.message.ack()
        qos._flush()  # kombu forgets acked deliveries lazily
        assert held.tag not in qos._delivered and not held_here(held.tag)
    finally:
        held.close()
        app.close()


def test_a_forked_pool_child_holds_no_delivery_and_acks_nothing(
        broker_url: str, plain: redis.Redis[bytes]) -> None:
    app = _app(broker_url, events=False)
    held = _Held(app, DueLap("run-c", 1, "loop", "1"))
    try:
        pid = os.fork()
        if pid == 0:  # the child: a prefork pool process running this lap
            code = 1
            try:
                CeleryDispatcher(app).send(DueLap("run-c", 2, "loop", "1"))
                code = 0 if not held_here(held.tag) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert plain.hexists("unacked", held.tag), "a child acked its parent's delivery"
        assert plain.llen(lap_queue("loop", "1")) == 1
        held.message.ack()
        assert not plain.hexists("unacked", held.tag)
    finally:
        held.close()
        app.close()


def test_a_threads_worker_acks_each_lap_with_its_successor(aw: AgentWorker,
                                                           fleet: Fleet) -> None:
    monitor = redis.Redis.from_url(fleet.env["AGENT_WORKER_BROKER_URL"])
    db = monitor.connection_pool.connection_kwargs.get("db", 0)
    commands: list[str] = []
    ready = threading.Event()

    def watch() -> None:
        with monitor.monitor() as m:
            ready.set()
            for entry in m.listen():
                if int(entry["db"]) != int(db):
                    continue  # another test session's Redis database
                commands.append(entry["command"])
                if entry["command"].startswith("PING done"):
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    fleet.worker(concurrency=2, AGENT_WORKER_WORKER_POOL="threads",
                 AGENT_WORKER_TASK_EVENTS="false")
    run = aw.start_run("loop", {"laps": 6})
    done = aw.wait(run.id, timeout=60)
    redis.Redis.from_url(fleet.env["AGENT_WORKER_BROKER_URL"]).execute_command("PING", "done")
    watcher.join(10)
    monitor.close()
    assert done.status == "succeeded", done.error_detail
    assert_laps_exactly_once(aw, run.id, 6)
    # Each successor's LPUSH shares a MULTI with its predecessor's ZREM and HDEL.
    merged = sum(1 for i, c in enumerate(commands[:-3])
                 if c == "MULTI" and commands[i + 1].startswith("LPUSH")
                 and commands[i + 2].startswith("ZREM unacked_index"))
    assert merged >= 5, commands
    leftover = redis.Redis.from_url(fleet.env["AGENT_WORKER_BROKER_URL"])
    assert leftover.hlen("unacked") == 0 and leftover.zcard("unacked_index") == 0
