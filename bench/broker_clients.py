"""CPU of a lap message's broker round (publish, delivery, ack) through kombu's
stock Redis transport and through ``tasks.broker``'s, which keeps one redis-py
client per channel (issue 21 goal 2): ``python -m bench.broker_clients``.

Each round is what a worker does per lap on the broker: publish the next lap
(LPUSH), take it (BRPOP, ``QoS.append``'s MULTI), ack it (``QoS.ack``'s MULTI).
The transports take turns batch by batch on one Redis database; the figure is
this process's CPU time per round (``time.process_time``), median and range
over the batches, and the redis-py clients each round built.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

import redis
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue

from bench.common import RedisDb, spread


def _round_trips(conn: Connection, queue: Queue, n: int) -> float:
    """CPU seconds for ``n`` publish-deliver-ack rounds on ``conn``."""
    channel = conn.default_channel
    producer = Producer(channel, serializer="json")
    got: list[Any] = []
    with Consumer(channel, [queue], callbacks=[lambda body, m: got.append(m)],
                  accept=["json"], prefetch_count=1):
        start = time.process_time()
        for i in range(n):
            producer.publish({"run_id": "r", "lap": i}, exchange=queue.exchange,
                             routing_key=queue.routing_key)
            while not got:
                conn.drain_events(timeout=5)
            got.pop().ack()
        return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.broker_clients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=500, help="rounds per batch")
    p.add_argument("--batches", type=int, default=7)
    args = p.parse_args(argv)
    built = [0]
    init = redis.Redis.__init__

    def counting(self: Any, *a: Any, **kw: Any) -> None:
        built[0] += 1
        init(self, *a, **kw)

    redis.Redis.__init__ = counting  # type: ignore[method-assign]
    load = os.getloadavg()
    with RedisDb() as db:
        apps = {"kombu's transport": Celery("stock", broker=db.url, set_as_current=False),
                "tasks.broker": Celery("ours", broker=db.url, amqp="tasks.broker:LapAMQP",
                                       set_as_current=False)}
        cpu: dict[str, list[float]] = {name: [] for name in apps}
        clients: dict[str, int] = dict.fromkeys(apps, 0)
        name = f"bc-{uuid.uuid4().hex[:8]}"
        queue = Queue(name, Exchange(name), routing_key=name)
        for batch in range(args.batches + 1):  # the first batch warms up
            for label, app in apps.items():
                with app.connection_for_write() as conn:
                    queue(conn.default_channel).declare()
                    before = built[0]
                    seconds = _round_trips(conn, queue, args.rounds)
                    if batch:
                        cpu[label].append(seconds / args.rounds * 1e6)
                        clients[label] += built[0] - before
    print(f"load average before {load}, after {os.getloadavg()}; "
          f"{args.batches} batches of {args.rounds} rounds")
    print("| transport | CPU µs per round (min-max) | redis-py clients built per round |")
    print("|---|---|---|")
    for label, samples in cpu.items():
        print(f"| {label} | {spread(samples)} | "
              f"{clients[label] / (args.batches * args.rounds):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
