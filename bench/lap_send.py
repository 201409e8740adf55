"""CPU and wall time of sending one lap message (issue 21 goal 2):
``python -m bench.lap_send``.

Celery's ``send_task``, as ``tasks.dispatch`` called it for every lap before
``tasks.lapsend``, against ``LapSender`` building the same message and
pushing it with one LPUSH, and a bare redis-py LPUSH of a message of that
size (the floor: the round trip itself). The three take turns batch by batch
on one Redis database; figures are medians and ranges over the batches of
this process's CPU time (``time.process_time``) and wall time per send.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import redis
from celery import Celery

import tasks.lap  # noqa: F401  (registers the lap task with every app, as in a worker)
from agent_worker.constants import LAP_TASK_NAME
from bench.common import RedisDb, spread
from store.base import DueLap
from tasks.broker import EVENT_EXCHANGE, LapAMQP
from tasks.lapsend import LapSender, agent_header, lap_kwargs
from tasks.routing import lap_queue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lap_send", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sends", type=int, default=2000, help="sends per batch")
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--events", action="store_true",
                   help="with task events on (the default of AGENT_WORKER_TASK_EVENTS): "
                        "each send also publishes task-sent")
    args = p.parse_args(argv)
    lap = DueLap("bench-run-0001", 7, "bench", "1")
    queue = lap_queue(lap.agent_name, lap.agent_version)
    with RedisDb() as rdb:
        app = Celery("lap-send-bench", broker=rdb.url, amqp=LapAMQP, set_as_current=False)
        app.conf.update(task_serializer="json", accept_content=["json"],
                        task_send_sent_event=args.events, event_exchange=EVENT_EXCHANGE)
        sender = LapSender(app)
        plain = redis.Redis.from_url(rdb.url)
        kwargs = lap_kwargs(lap)

        def send_task() -> None:
            app.send_task(LAP_TASK_NAME, kwargs=kwargs, queue=queue, headers=agent_header(lap),
                          argsrepr="()", kwargsrepr=repr(kwargs), declare=[])

        def lap_sender() -> None:
            sender.send(lap, queue)

        lap_sender()
        sample = plain.lpop(queue) or b""

        def bare_lpush() -> None:
            plain.lpush(queue, sample)

        ways: dict[str, Callable[[], None]] = {
            "send_task": send_task, "LapSender": lap_sender, "bare LPUSH": bare_lpush}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        wall: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.batches):
            for name, send in ways.items():
                c, t = time.process_time(), time.perf_counter()
                for _ in range(args.sends):
                    send()
                cpu[name].append((time.process_time() - c) / args.sends * 1e6)
                wall[name].append((time.perf_counter() - t) / args.sends * 1e6)
                plain.delete(queue)
        app.close()
        plain.close()
    print(f"message of {len(sample)} B; {args.batches} batches of {args.sends} sends; "
          f"task-sent events {'on' if args.events else 'off'}")
    print("| way | CPU µs/send (min-max) | wall µs/send (min-max) |")
    print("|---|---|---|")
    for name in ways:
        print(f"| {name} | {spread(cpu[name])} | {spread(wall[name])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
