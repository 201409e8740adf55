"""IO-bound concurrency: ``python -m bench.iobound``.

Starts a loopback provider answering every model call after ``--latency``
seconds (``bench.io_provider``), ``--workers`` real ``celery -A agent_worker.tasks worker``
processes of the chosen pool, then enqueues ``--runs`` runs of ``--laps`` laps
at once and waits for all of them to finish, every lap committed once.

* lap rate = laps committed / seconds from the first send to the last commit
  (ramp and tail included); ideal = runs in flight / model latency; the ratio
  is the goal's figure (at least 0.8 with 500 runs and 1 s). The steady rate,
  between the 10th and 90th percentile of commits, is printed beside it.
* memory per in-flight lap = (peak RSS of the workers, main processes and pool
  children, while the runs move, minus their RSS when idle) / runs in flight.
* the machine's CPU per lap, split into the workers, the loopback provider and
  the rest (Postgres, Redis, this process, the kernel), the rest's Postgres and
  Redis processes told apart, and the ratio the machine's cores could carry
  at that CPU per lap: what bounds the goal here.

Prints the figures with the machine's load and writes ``bench/results/iobound.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from agent_worker.core.settings import Settings
from bench.common import RESULTS, Proc, log, wait_for
from bench.fleets import BenchFleet, cpu_by_name, cpu_seconds, cpu_since, machine_busy_seconds
from bench.io_agent import IO_AGENT_NAME
from bench.workload import run_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def loopback_provider(latency: float, logdir: Path) -> tuple[Proc, str]:
    """The loopback model provider (``bench.io_provider``) answering after
    ``latency`` seconds, once it listens, and its base URL; stopped again if
    it never does."""
    port = _free_port()
    provider = Proc([sys.executable, "-m", "bench.io_provider", "--port", str(port),
                     "--latency", str(latency)], dict(os.environ),
                    logdir / "provider.log").start()
    try:
        wait_for(lambda: _listening(port), 30, what="provider listening")
    except BaseException:
        provider.stop()
        raise
    return provider, f"http://127.0.0.1:{port}/v1"


def _progress(fleet: BenchFleet, prefix: str) -> tuple[int, int]:
    """(runs not finished, laps committed) of the runs named ``prefix-…``."""
    with fleet.store.engine.connect() as c:
        left = c.execute(text(
            "SELECT count(*) FROM runs WHERE id LIKE :p AND status NOT IN "
            "('succeeded', 'failed', 'cancelled')"), {"p": f"{prefix}-%"}).scalar_one()
        laps = c.execute(text("SELECT count(*) FROM checkpoints WHERE run_id LIKE :p "
                              "AND lap > 0"), {"p": f"{prefix}-%"}).scalar_one()
    return int(left), int(laps)


def _check(fleet: BenchFleet, prefix: str, runs: int, laps: int) -> None:
    """Fail loudly unless every run succeeded with laps 0..``laps`` committed once."""
    with fleet.store.engine.connect() as c:
        bad = c.execute(text(
            "SELECT id, status, next_lap, error_message FROM runs WHERE id LIKE :p AND "
            "(status <> 'succeeded' OR next_lap <> :n) LIMIT 3"),
            {"p": f"{prefix}-%", "n": laps + 1}).all()
        count = c.execute(text("SELECT count(DISTINCT (run_id, lap)) FROM checkpoints "
                               "WHERE run_id LIKE :p"), {"p": f"{prefix}-%"}).scalar_one()
    if bad or count != runs * (laps + 1):
        raise RuntimeError(f"expected {runs} runs of {laps} laps each committed once; "
                           f"counted {count} checkpoints; e.g. {bad}")


#: The services whose CPU ``measure`` tells apart from the rest, by process name.
SERVICES = ("postgres", "redis-server")


def _steady(samples: list[tuple[float, int]], total: int) -> float:
    """Laps per second between the samples where 10% and 90% of laps were in."""
    lo = next((s for s in samples if s[1] >= total * 0.1), samples[0])
    hi = next((s for s in samples if s[1] >= total * 0.9), samples[-1])
    return (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else float("nan")


def measure(fleet: BenchFleet, runs: int, laps: int, latency: float, prefix: str,
            timeout: float, provider: int) -> dict[str, Any]:
    """Enqueue ``runs`` runs at once and follow them to the end (wall clock of
    this process, polled every 0.2 s: the makespan errs long, never short).
    ``provider`` is the loopback provider's pid, whose CPU is told apart."""
    rss_idle = fleet.rss()
    rids = [run_id(prefix, laps, i) for i in range(runs)]
    fleet.deferred.hold()  # every first lap goes out at once, after every run exists
    for rid in rids:
        fleet.aw.start_run(IO_AGENT_NAME, {"task": "work through the plan"}, run_id=rid)
    # From here on, not before: creating the runs is not the laps' CPU.
    cpu0, busy0, provider0 = fleet.cpu(), machine_busy_seconds(), cpu_seconds(provider)
    services0 = cpu_by_name(SERVICES)
    t0 = time.monotonic()
    fleet.deferred.flush()
    peak, samples = rss_idle, [(0.0, 0)]
    while True:
        left, done = _progress(fleet, prefix)
        now = time.monotonic() - t0
        samples.append((now, done))
        if not left:
            break
        if now > timeout:
            raise RuntimeError(f"{left} of {runs} runs unfinished after {timeout:.0f} s")
        peak = max(peak, fleet.rss())
        time.sleep(0.2)
    cpu1, busy1, provider1 = fleet.cpu(), machine_busy_seconds(), cpu_seconds(provider)
    services = cpu_since(services0, cpu_by_name(SERVICES))
    if os.environ.get("AGENT_WORKER_BENCH_DEBUG"):
        log(f"samples {[(round(t, 1), n) for t, n in samples]}")
    _check(fleet, prefix, runs, laps)
    total = runs * laps
    makespan = samples[-1][0]
    rate, steady, ideal = total / makespan, _steady(samples, total), runs / latency
    per_lap = 1e3 / total  # seconds of the whole run -> ms a lap
    main_ms, children_ms = (cpu1[0] - cpu0[0]) * per_lap, (cpu1[1] - cpu0[1]) * per_lap
    machine_ms, provider_ms = (busy1 - busy0) * per_lap, (provider1 - provider0) * per_lap
    cores = os.cpu_count() or 1
    return {
        "runs": runs, "laps": laps, "latency_s": latency, "makespan_s": makespan,
        "laps_per_s": rate, "steady_laps_per_s": steady, "ideal_laps_per_s": ideal,
        "ratio": rate / ideal, "steady_ratio": steady / ideal,
        "rss_idle_mb": rss_idle / 2**20, "rss_peak_mb": peak / 2**20,
        "kb_per_inflight_lap": (peak - rss_idle) / runs / 1024,
        "cpu_ms_per_lap_main": main_ms, "cpu_ms_per_lap_children": children_ms,
        "machine_cpu_ms_per_lap": machine_ms, "provider_cpu_ms_per_lap": provider_ms,
        "rest_cpu_ms_per_lap": machine_ms - main_ms - children_ms - provider_ms,
        # Of the rest: the server's processes (every database's backends, the
        # WAL writer, ...: the machine is shared) and Redis's.
        "postgres_cpu_ms_per_lap": services.get("postgres", 0.0) * per_lap,
        "redis_cpu_ms_per_lap": services.get("redis-server", 0.0) * per_lap,
        "machine_busy": (busy1 - busy0) / makespan / cores, "cores": cores,
        # The most this machine's cores could carry at this CPU per lap, as a share of ideal.
        "cpu_bound_ratio": cores * 1e3 / machine_ms / ideal if machine_ms else float("nan"),
    }


@dataclass(frozen=True)
class Fleet:
    """What one ``bench.iobound`` measurement runs: the workload and the workers."""

    runs: int = 500
    laps: int = 10
    latency: float = 1.0
    workers: int = 2
    pool: str = "threads"
    concurrency: int = 0  # 0: runs / workers + 10%
    events: bool = False
    #: AGENT_WORKER_WORKER_DB_POOL_SIZE of each worker: README's IO-bound
    #: setting for a worker of hundreds of laps at once (20, the default, cost
    #: 6.6 against 5.6 ms of machine CPU a lap here: BENCHMARKS.md, "Lap
    #: commits no longer queue behind NOTIFY").
    db_pool: int = 40
    #: AGENT_WORKER_WORKER_ACTIVE_LAPS of each worker (``engine.active_laps``;
    #: 0: no limit, as before it existed).
    active_laps: int = Settings.model_fields["worker_active_laps"].default

    def per_worker(self) -> int:
        return self.concurrency or -(-self.runs * 11 // (10 * self.workers))


def run_fleet(spec: Fleet, logdir: Path, worker_env: Mapping[str, str] | None = None,
              during: Callable[[BenchFleet], None] | None = None) -> dict[str, Any]:
    """One measurement: a loopback provider, ``spec.workers`` workers (with
    ``worker_env`` on top of the fleet's settings), a warm-up, then ``measure``.
    ``during(fleet)`` is called right before and right after the measured
    runs, while the workers still run (a caller's own readings)."""
    concurrency = spec.per_worker()
    provider, model_url = loopback_provider(spec.latency, logdir)
    load_before = os.getloadavg()
    fleet: BenchFleet | None = None
    try:
        fleet = BenchFleet("iobound", {
            "AGENT_WORKER_WORKER_POOL": spec.pool,
            "AGENT_WORKER_WORKER_DB_POOL_SIZE": str(spec.db_pool),
            "AGENT_WORKER_WORKER_ACTIVE_LAPS": str(spec.active_laps),
            "AGENT_WORKER_TASK_EVENTS": "true" if spec.events else "false",
            "AGENT_WORKER_BENCH_MODEL_URL": model_url,
            "AGENT_WORKER_BENCH_MODEL_KEY": "loopback"}, logdir, agent_modules="bench.io_agent")
        os.environ.update(AGENT_WORKER_BENCH_MODEL_URL=model_url)
        for _ in range(spec.workers):
            fleet.worker(concurrency, **(worker_env or {}))
        log(f"{spec.workers} workers, pool {spec.pool}, concurrency {concurrency} each")
        measure(fleet, spec.workers * 2, 2, spec.latency, "iowarm", 120,  # start-up, connections
                provider.pid)
        if during is not None:
            during(fleet)
        result = measure(fleet, spec.runs, spec.laps, spec.latency, "io",
                         timeout=120 + spec.laps * spec.latency * 10, provider=provider.pid)
        if during is not None:
            during(fleet)
    finally:
        if fleet is not None:
            fleet.close()
        provider.stop()
    result.update(pool=spec.pool, workers=spec.workers, concurrency=concurrency,
                  db_pool=spec.db_pool, active_laps=spec.active_laps,
                  task_events=spec.events, agent=IO_AGENT_NAME,
                  load=[load_before, os.getloadavg()])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.iobound", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=Fleet.runs, help="runs in flight")
    p.add_argument("--laps", type=int, default=Fleet.laps, help="laps per run")
    p.add_argument("--latency", type=float, default=Fleet.latency,
                   help="model latency, seconds")
    p.add_argument("--workers", type=int, default=Fleet.workers, help="worker processes")
    p.add_argument("--pool", default=Fleet.pool, help="AGENT_WORKER_WORKER_POOL")
    p.add_argument("--concurrency", type=int, default=Fleet.concurrency,
                   help="laps per worker at once (default: runs / workers + 10%%)")
    p.add_argument("--events", action="store_true", help="send Celery task events too")
    p.add_argument("--db-pool", type=int, default=Fleet.db_pool,
                   help="AGENT_WORKER_WORKER_DB_POOL_SIZE of each worker")
    p.add_argument("--active-laps", type=int, default=Fleet.active_laps,
                   help="AGENT_WORKER_WORKER_ACTIVE_LAPS of each worker (0: no limit)")
    args = p.parse_args(argv)
    logdir = RESULTS / "logs" / f"iobound-{time.strftime('%Y%m%dT%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    result = run_fleet(Fleet(args.runs, args.laps, args.latency, args.workers, args.pool,
                             args.concurrency, args.events, args.db_pool, args.active_laps),
                       logdir)
    _print(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(RESULTS / "iobound.json").write_text(json.dumps(result, indent=2))
    return 0


def _print(r: dict[str, Any]) -> None:
    print(f"\nload average (1, 5, 15 min) before {r['load'][0]}, after {r['load'][1]}")
    print(f"{r['runs']} runs x {r['laps']} laps, model latency {r['latency_s']} s, "
          f"{r['workers']} workers ({r['pool']}, concurrency {r['concurrency']}, "
          f"{r['db_pool']} Postgres connections kept, "
          f"{r['active_laps'] or 'any number of'} laps at work at once, "
          f"task events {'on' if r['task_events'] else 'off'})")
    print(f"lap rate {r['laps_per_s']:.1f}/s over {r['makespan_s']:.1f} s "
          f"(steady {r['steady_laps_per_s']:.1f}/s); ideal {r['ideal_laps_per_s']:.1f}/s; "
          f"ratio {r['ratio']:.2f} (steady {r['steady_ratio']:.2f})")
    print(f"RSS idle {r['rss_idle_mb']:.0f} MB, peak {r['rss_peak_mb']:.0f} MB: "
          f"{r['kb_per_inflight_lap']:.0f} KB per in-flight lap; CPU per lap "
          f"{r['cpu_ms_per_lap_main']:.2f} ms main + {r['cpu_ms_per_lap_children']:.2f} ms pool")
    print(f"machine CPU per lap {r['machine_cpu_ms_per_lap']:.2f} ms (workers "
          f"{r['cpu_ms_per_lap_main'] + r['cpu_ms_per_lap_children']:.2f}, provider "
          f"{r['provider_cpu_ms_per_lap']:.2f}, Postgres, Redis and the rest "
          f"{r['rest_cpu_ms_per_lap']:.2f}: Postgres {r['postgres_cpu_ms_per_lap']:.2f}, Redis "
          f"{r['redis_cpu_ms_per_lap']:.2f}); {r['cores']} cores {100 * r['machine_busy']:.0f}% "
          f"busy; at this CPU per lap they carry at most {r['cpu_bound_ratio']:.2f} of ideal")


if __name__ == "__main__":
    raise SystemExit(main())
