"""Reproduce every figure in BENCHMARKS.md: ``python -m bench.run``.

Creates its own databases on the shared Postgres server and takes a free Redis
database (never restarting either), runs each phase, writes
``bench/results/results.json`` (plus a timestamped copy), and regenerates the
generated part of ``BENCHMARKS.md`` and ``bench/plot.png``. A phase that fails
is recorded under ``errors`` and the others still run, so a half-broken tree
still yields a report that says what broke.

``--quick`` is a smoke run (under two minutes); ``--report-only`` re-renders
the report from the last results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bench.common import (
    RESULTS,
    ROOT,
    RedisDb,
    create_database,
    drop_database,
    log,
    sa_url,
    server_settings,
)
from bench.workload import QUICK_SIZES, SIZES

PHASES = ("floor", "ours", "ours_load", "langgraph", "langgraph_load", "celery",
          "throughput", "langgraph_throughput", "recovery", "profile")


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]
    repeats: int
    load_samples: int
    floor_samples: int
    processes: tuple[int, ...]
    tp_runs: int
    tp_laps: int
    tp_repeats: int
    recovery_repeats: int
    profile_laps: int
    variants: tuple[str, ...]
    phases: tuple[str, ...]
    quick: bool


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small N, few repeats")
    p.add_argument("--repeats", type=int, help="runs per (system, N) (default 3; quick 1)")
    p.add_argument("--sizes", help="comma-separated run lengths (default 50,200,500)")
    p.add_argument("--processes", default="1,2,4", help="worker processes for throughput")
    p.add_argument("--tp-runs", type=int, help="concurrent runs for throughput (default 200)")
    p.add_argument("--tp-laps", type=int, help="laps per throughput run (default 10)")
    p.add_argument("--tp-repeats", type=int, help="throughput repeats (default 1)")
    p.add_argument("--only", help=f"comma-separated phases to run, of: {', '.join(PHASES)}")
    p.add_argument("--skip", help="comma-separated phases to skip")
    p.add_argument("--no-delta", action="store_true", help="skip LangGraph's DeltaChannel")
    p.add_argument("--keep-db", action="store_true", help="keep the benchmark databases")
    p.add_argument("--report-only", action="store_true",
                   help="re-render BENCHMARKS.md and the plot from the last results")
    a = p.parse_args(argv)
    q = a.quick
    phases = tuple(a.only.split(",")) if a.only else PHASES
    unknown = set(phases) - set(PHASES) | (set(a.skip.split(",")) - set(PHASES) if a.skip
                                           else set())
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}")
    if a.skip:
        phases = tuple(x for x in phases if x not in a.skip.split(","))
    sizes = (tuple(int(x) for x in a.sizes.split(",")) if a.sizes
             else QUICK_SIZES if q else SIZES)
    cfg = Config(
        sizes=sizes, repeats=a.repeats or (1 if q else 3), load_samples=10 if q else 30,
        floor_samples=100 if q else 500,
        processes=tuple(int(x) for x in a.processes.split(",")),
        tp_runs=a.tp_runs or (40 if q else 200), tp_laps=a.tp_laps or (3 if q else 10),
        tp_repeats=a.tp_repeats or 1, recovery_repeats=1 if q else 3,
        profile_laps=60 if q else 200,
        variants=("langgraph",) if a.no_delta else ("langgraph", "langgraph-delta"),
        phases=phases, quick=q)
    return cfg, a


def meta(cfg: Config) -> dict[str, Any]:
    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "-"

    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    cpu = next((line.split(":", 1)[1].strip() for line in
                open("/proc/cpuinfo").read().splitlines() if line.startswith("model name")), "?")
    mem = next((line.split(":", 1)[1].strip() for line in
                open("/proc/meminfo").read().splitlines() if line.startswith("MemTotal")), "?")
    import redis

    from bench.common import REDIS

    r = redis.Redis.from_url(REDIS)
    redis_version = str(r.info("server").get("redis_version", "?"))
    r.close()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.run " + " ".join(sys.argv[1:]),
        "commit": sh("git", "rev-parse", "--short", "HEAD"),
        "dirty": bool(sh("git", "status", "--porcelain", "--", "agent_worker", "store",
                         "tasks")),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "memory": mem,
                    "kernel": platform.release(), "python": platform.python_version()},
        "postgres": server_settings(), "redis": redis_version,
        "packages": {p: ver(p) for p in (
            "agent-worker", "sqlalchemy", "psycopg", "celery", "kombu", "redis", "pydantic",
            "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres",
            "langchain-core", "pyinstrument")},
        "loadavg_start": os.getloadavg(), "config": asdict(cfg),
    }


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse(argv)
    from bench.report import render

    if args.report_only:
        render(json.loads((RESULTS / "results.json").read_text()))
        return 0
    began = time.monotonic()
    results: dict[str, Any] = {"meta": meta(cfg), "errors": {}}
    tag = f"bench_{os.getpid()}"
    names = {"ours": f"{tag}_ours", "lg": f"{tag}_lg", "floor": f"{tag}_floor"}
    urls = {k: create_database(v) for k, v in names.items()}
    logdir = RESULTS / "logs"
    # The in-process runner and the API read settings from the environment.
    os.environ.update(AGENT_WORKER_DATABASE_URL=sa_url(urls["ours"]),
                      AGENT_WORKER_AGENT_MODULES="bench.agents")

    def phase(name: str, fn: Callable[[], Any], key: str | None = None) -> Any:
        """Run phase ``name`` (if selected), storing its figures under ``key``."""
        key = key or name
        if name not in cfg.phases:
            return None
        log(f"--- {key}")
        t0 = time.monotonic()
        try:
            results[key] = fn()
        except Exception as e:
            results["errors"][key] = "".join(traceback.format_exception(e))[-3000:]
            log(f"{key} FAILED: {e!r}")
        results.setdefault("seconds", {})[key] = round(time.monotonic() - t0, 1)
        return results.get(key)

    try:
        with RedisDb() as rdb:
            os.environ["AGENT_WORKER_BROKER_URL"] = rdb.url
            from agent_worker.settings import get_settings

            get_settings.cache_clear()
            _phases(cfg, urls, rdb, logdir, phase, results)
    finally:
        if not args.keep_db:
            for name in names.values():
                drop_database(name)
    results["meta"]["loadavg_end"] = os.getloadavg()
    results["meta"]["total_seconds"] = round(time.monotonic() - began, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, default=str)
    (RESULTS / "results.json").write_text(text)
    (RESULTS / f"results-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if cfg.quick else ''}.json"
     ).write_text(text)
    render(results)
    log(f"done in {results['meta']['total_seconds']:.0f} s; errors: "
        f"{sorted(results['errors']) or 'none'}")
    return 1 if results["errors"] else 0


def _phases(cfg: Config, urls: dict[str, str], rdb: RedisDb, logdir: Any,
            phase: Callable[..., Any], results: dict[str, Any]) -> None:
    from bench import floor, ours

    n_max = max(cfg.sizes)
    phase("floor", lambda: floor.bench_floor(urls["floor"], rdb.url, cfg.floor_samples))
    got = phase("ours", lambda: ours.bench_inprocess(urls["ours"], cfg.sizes, cfg.repeats,
                                                     "in"))
    if got:
        phase("ours_load", lambda: ours.bench_load(
            urls["ours"], {n: got[str(n)]["run_id"] for n in cfg.sizes}, cfg.load_samples))
    try:
        from bench import langgraph_bench as lg
    except ImportError as e:
        results["errors"]["langgraph"] = f"not installed (pip install -e '.[bench]'): {e}"
        lg = None  # type: ignore[assignment]
    if lg is not None:
        if {"langgraph", "langgraph_load", "langgraph_throughput"} & set(cfg.phases):
            lg.setup(urls["lg"])
        results["meta"]["packages"].update(lg.versions())
        for i, variant in enumerate(cfg.variants):
            key = variant.replace("-", "_")
            runs = phase("langgraph", lambda v=variant, i=i: lg.bench_runs(
                urls["lg"], v, cfg.sizes, cfg.repeats, f"lg{i}"), key)
            if runs:
                phase("langgraph_load", lambda v=variant, r=runs: lg.bench_load(
                    urls["lg"], v, {n: r[str(n)]["run_id"] for n in cfg.sizes},
                    cfg.load_samples), f"{key}_load")
    phase("celery", lambda: ours.bench_celery(urls["ours"], rdb.url, cfg.sizes, cfg.repeats,
                                              "cel", logdir))
    rdb.flush()
    phase("throughput", lambda: ours.bench_throughput(
        urls["ours"], rdb.url, cfg.processes, cfg.tp_runs, cfg.tp_laps, cfg.tp_repeats, "tp",
        logdir))
    if lg is not None:
        phase("langgraph_throughput", lambda: lg.bench_throughput(
            urls["lg"], "langgraph", cfg.processes, cfg.tp_runs, cfg.tp_laps, cfg.tp_repeats,
            "lgtp"))
    rdb.flush()
    phase("recovery", lambda: ours.bench_recovery(urls["ours"], rdb.url, cfg.recovery_repeats,
                                                  "rec", logdir))
    phase("profile", lambda: ours.profile_inprocess(
        urls["ours"], min(cfg.profile_laps, n_max), "prof", RESULTS / "profile.html"))


if __name__ == "__main__":
    raise SystemExit(main())
