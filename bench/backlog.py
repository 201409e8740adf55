"""Hand-offs under a backlog: ``python -m bench.backlog``.

One worker (prefork, concurrency 2) and beat with the default timings (lease
10 s, sweep 2 s) run IO-bound laps (``bench.io_agent`` against the loopback
provider, ``--latency`` a model call). Three phases, one after the other:

* ``unloaded``: ``--base-runs`` runs at once, few enough that no lap message
  waits in Redis as long as the hand-off timeout (the lease TTL);
* ``burst``: ``--burst`` times as many runs at once, so lap messages wait in
  Redis far longer than the hand-off timeout;
* ``after``: ``--base-runs`` runs again, started as soon as every burst run
  finished (whatever the burst left in Redis still there): the fleet's rate
  once the burst is over, against the ``unloaded`` one.

For each phase: lap messages published per lap committed (every delivery the
worker logged, ``Task ... received``, plus what Redis still holds: a message
the sweeper sent again is delivered and refused like any other), the queue's
peak length, the lap rate (laps / seconds from the first send to the last
commit) and when the first and last runs finished. Every run must finish with
each lap committed once. The figures the hand-off promises: at most 1.2
messages a lap, and the ``after`` rate back at the ``unloaded`` one.

``--tree`` runs the workers and beat from another source tree (e.g. a
``git archive`` of the commit before a change): the before of a before/after.
Prints the table and writes ``bench/results/backlog.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import redis

from agent_worker.tasks.routing import lap_queue
from bench.common import RESULTS, ROOT, Proc, celery_beat, log, wait_for
from bench.fleets import BenchFleet
from bench.io_agent import IO_AGENT_NAME
from bench.iobound import _check, _progress, loopback_provider
from bench.workload import run_id

QUEUE = lap_queue(IO_AGENT_NAME, "1")
RECEIVED = b"Task agent_worker.run_lap["


def _received(fleet: BenchFleet) -> int:
    """Lap messages the fleet's workers took from Redis so far (their logs)."""
    total = 0
    for w in fleet.workers:
        with open(w.log, "rb") as f:
            total += sum(1 for line in f if RECEIVED in line and b"] received" in line)
    return total


def _held(r: redis.Redis[bytes]) -> int:
    """Lap messages in Redis: queued, or delivered and not yet acked."""
    return int(r.llen(QUEUE)) + int(r.hlen("unacked"))


def phase(fleet: BenchFleet, r: redis.Redis[bytes], prefix: str, runs: int, laps: int,
          timeout: float, *, left_over: int = 0, drain: bool = True) -> dict[str, Any]:
    """Start ``runs`` runs at once and follow them to the end. Messages the
    phase published: those the worker took meanwhile, less ``left_over`` (an
    earlier phase's, held in Redis when this one started), plus those still
    held at its end (``drain``: none, the queue is let drain first: stale
    copies are delivered and refused)."""
    before = _received(fleet)
    t0 = time.monotonic()
    # Each run's first lap is sent as it starts, as an application does: a
    # message held back while the rest are created would be missing from its
    # queue, and the sweeper would rightly send it again.
    for i in range(runs):
        fleet.aw.start_run(IO_AGENT_NAME, {"task": "work through the plan"},
                           run_id=run_id(prefix, laps, i))
    peak, first_done = 0, None
    while True:
        left, _ = _progress(fleet, prefix)
        now = time.monotonic() - t0
        peak = max(peak, int(r.llen(QUEUE)))
        if first_done is None and left < runs:
            first_done = now
        if not left:
            break
        if now > timeout:
            raise RuntimeError(f"{left} of {runs} runs unfinished after {timeout:.0f} s")
        time.sleep(0.2)
    makespan = time.monotonic() - t0
    _check(fleet, prefix, runs, laps)
    if drain:
        wait_for(lambda: _held(r) == 0, timeout=600, interval=0.5,
                 what="the lap queue to drain")
        # The worker logs a delivery as it takes it; give the last lines a moment.
        time.sleep(1.0)
    held = _held(r)
    messages = _received(fleet) - before - left_over + held
    total = runs * laps
    return {"runs": runs, "laps": laps, "laps_committed": total, "messages": messages,
            "held_at_end": held,
            "messages_per_lap": messages / total, "queue_peak": peak,
            "makespan_s": makespan, "laps_per_s": total / makespan,
            "first_finished_s": first_done, "drained_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-runs", type=int, default=30, help="runs of the unloaded phases")
    p.add_argument("--burst", type=int, default=10, help="burst size, times --base-runs")
    p.add_argument("--laps", type=int, default=5, help="laps per run")
    p.add_argument("--latency", type=float, default=0.25, help="model latency, seconds")
    p.add_argument("--concurrency", type=int, default=2, help="the one worker's concurrency")
    p.add_argument("--pool", choices=("prefork", "threads"), default="prefork",
                   help="the worker's pool (deploy/ runs threads of concurrency 64)")
    p.add_argument("--tree", default="", help="run workers and beat from this source tree")
    args = p.parse_args(argv)
    tree = Path(args.tree).resolve() if args.tree else ROOT
    logdir = RESULTS / "logs" / f"backlog-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    provider, model_url = loopback_provider(args.latency, logdir)
    load_before = os.getloadavg()
    fleet: BenchFleet | None = None
    beat: Proc | None = None
    results: dict[str, Any] = {}
    try:
        os.environ["AGENT_WORKER_BENCH_MODEL_URL"] = model_url
        fleet = BenchFleet("backlog", {
            "AGENT_WORKER_WORKER_POOL": args.pool, "AGENT_WORKER_TASK_EVENTS": "false",
            "AGENT_WORKER_BENCH_MODEL_URL": model_url,
            "AGENT_WORKER_BENCH_MODEL_KEY": "loopback"}, logdir,
            agent_modules="bench.io_agent", tree=tree)
        fleet.worker(args.concurrency, loglevel="INFO")
        beat = celery_beat(fleet.env, logdir / "beat.log")
        r = redis.Redis.from_url(fleet.redis.url)
        ideal = args.concurrency / args.latency
        phase(fleet, r, "bkwarm", 4, 2, timeout=120)
        plan = [("unloaded", args.base_runs), ("burst", args.base_runs * args.burst),
                ("after", args.base_runs)]
        left_over = 0
        for name, runs in plan:
            log(f"{name}: {runs} runs x {args.laps} laps")
            # The burst's stale copies, if any, are still in Redis when the
            # ``after`` runs start: what they cost is part of the figure.
            results[name] = phase(fleet, r, f"bk{name}", runs, args.laps,
                                  timeout=120 + 20 * runs * args.laps / ideal,
                                  left_over=left_over, drain=name != "burst")
            left_over = results[name]["held_at_end"]
            log(f"{name}: {json.dumps(results[name])}")
        r.close()
    finally:
        if beat is not None:
            beat.stop()
        if fleet is not None:
            fleet.close()
        provider.stop()
    report = {"tree": str(tree), "pool": args.pool, "concurrency": args.concurrency,
              "latency_s": args.latency,
              "load": [load_before, os.getloadavg()], "phases": results,
              "after_vs_unloaded": results["after"]["laps_per_s"]
              / results["unloaded"]["laps_per_s"]}
    _print(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "backlog.json").write_text(json.dumps(report, indent=2))
    return 0


def _print(rep: dict[str, Any]) -> None:
    print(f"\nload average (1, 5, 15 min) before {rep['load'][0]}, after {rep['load'][1]}")
    print(f"tree {rep['tree']}; one {rep['pool']} worker of concurrency {rep['concurrency']}, "
          f"model latency {rep['latency_s']} s")
    print("| phase | runs x laps | messages / lap | queue peak | laps/s | first run done (s) "
          "| last run done (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, ph in rep["phases"].items():
        print(f"| {name} | {ph['runs']} x {ph['laps']} | {ph['messages_per_lap']:.2f} "
              f"| {ph['queue_peak']} | {ph['laps_per_s']:.2f} | {ph['first_finished_s']:.1f} "
              f"| {ph['makespan_s']:.1f} |")
    print(f"after the burst, the lap rate is {rep['after_vs_unloaded']:.2f} of the unloaded one")


if __name__ == "__main__":
    raise SystemExit(main())
