"""Reproduce every figure in BENCHMARKS.md: ``python -m bench.run``.

Creates its own databases on the shared Postgres server and takes a free Redis
database (never restarting either), runs each phase, writes
``bench/results/results.json`` (plus a timestamped copy), and regenerates the
generated part of ``BENCHMARKS.md`` and ``bench/plot.png``. A phase that fails
is recorded under ``errors`` and the others still run, so a half-broken tree
still yields a report that says what broke.

``--quick`` is a smoke run (under two minutes) that reports to
``bench/results/BENCHMARKS-quick.md`` and leaves the published figures alone;
``--only``/``--systems`` re-measure part and merge it into the last results;
``--report-only`` re-renders the report from the last results.
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
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    ROOT,
    RedisDb,
    System,
    create_database,
    drop_database,
    interleaved_runs,
    log,
    sa_url,
    server_settings,
)
from bench.workload import QUICK_SIZES, SIZES

PHASES = ("floor", "overhead", "load", "throughput", "recovery", "profile")
SYSTEMS = ("ours", "celery", "langgraph", "langgraph-delta", "dbos", "bare-insert")


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
    systems: tuple[str, ...]
    phases: tuple[str, ...]
    quick: bool


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small N, few repeats")
    p.add_argument("--repeats", type=int, help="runs per (system, N) (default 5; quick 1)")
    p.add_argument("--sizes", help="comma-separated run lengths (default 50,200,500)")
    p.add_argument("--processes", default="1,2,4", help="worker processes for throughput")
    p.add_argument("--tp-runs", type=int, help="concurrent runs for throughput (default 200)")
    p.add_argument("--tp-laps", type=int, help="laps per throughput run (default 10)")
    p.add_argument("--tp-repeats", type=int, help="throughput repeats (default 2; quick 1)")
    p.add_argument("--only", help=f"comma-separated phases to run, of: {', '.join(PHASES)}")
    p.add_argument("--skip", help="comma-separated phases to skip")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated systems to compare, of: {', '.join(SYSTEMS)}")
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
    if set(a.systems.split(",")) - set(SYSTEMS):
        p.error(f"unknown systems {sorted(set(a.systems.split(',')) - set(SYSTEMS))}")
    if a.skip:
        phases = tuple(x for x in phases if x not in a.skip.split(","))
    sizes = (tuple(int(x) for x in a.sizes.split(",")) if a.sizes
             else QUICK_SIZES if q else SIZES)
    cfg = Config(
        sizes=sizes, repeats=a.repeats or (1 if q else 5), load_samples=10 if q else 30,
        floor_samples=100 if q else 500,
        processes=tuple(int(x) for x in a.processes.split(",")),
        tp_runs=a.tp_runs or (40 if q else 200), tp_laps=a.tp_laps or (3 if q else 10),
        tp_repeats=a.tp_repeats or (1 if q else 2), recovery_repeats=1 if q else 3,
        profile_laps=60 if q else 200,
        systems=tuple(x for x in a.systems.split(",") if x),
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

    def proc(path: str, field: str) -> str:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return "?"
        return next((x.split(":", 1)[1].strip() for x in lines if x.startswith(field)), "?")

    cpu, mem = proc("/proc/cpuinfo", "model name"), proc("/proc/meminfo", "MemTotal")
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
            "langchain-core", "dbos", "pyinstrument")},
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
    names = {k: f"{tag}_{k}" for k in ("ours", "celery", "langgraph", "langgraph_delta", "tp",
                                       "lg_tp", "floor", "dbos")}
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
        # The machine is shared: each phase's figures are read with the load
        # they were measured under.
        results.setdefault("loadavg_start", {})[key] = os.getloadavg()
        t0 = time.monotonic()
        try:
            results[key] = fn()
        except Exception as e:
            results["errors"][key] = "".join(traceback.format_exception(e))[-3000:]
            log(f"{key} FAILED: {e!r}")
        results.setdefault("seconds", {})[key] = round(time.monotonic() - t0, 1)
        results.setdefault("loadavg", {})[key] = os.getloadavg()
        return results.get(key)

    try:
        with RedisDb() as rdb:
            os.environ["AGENT_WORKER_BROKER_URL"] = rdb.url
            from agent_worker.core.settings import get_settings

            get_settings.cache_clear()
            _phases(cfg, urls, rdb, logdir, phase, results)
    finally:
        if not args.keep_db:
            for name in names.values():
                drop_database(name)
    results["meta"]["loadavg_end"] = os.getloadavg()
    results["meta"]["total_seconds"] = round(time.monotonic() - began, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    partial = cfg.phases != PHASES or set(cfg.systems) != set(SYSTEMS)
    kind = "-quick" if cfg.quick else "-partial" if partial else ""
    (RESULTS / f"results-{time.strftime('%Y%m%d-%H%M%S')}{kind}.json").write_text(
        json.dumps(results, indent=1, default=str))
    errors = sorted(results["errors"])
    if cfg.quick:  # a smoke run never replaces the published figures
        render(results, RESULTS / "BENCHMARKS-quick.md", RESULTS / "plot-quick.png")
        log(f"quick report: {RESULTS / 'BENCHMARKS-quick.md'}")
    else:
        if partial:
            results = _merge(results)
        (RESULTS / "results.json").write_text(json.dumps(results, indent=1, default=str))
        render(results)
    log(f"done in {time.monotonic() - began:.0f} s; errors: {errors or 'none'}")
    return 1 if errors else 0


def _merge(new: dict[str, Any]) -> dict[str, Any]:
    """A partial run updates the figures it re-measured in the last results of
    the same run lengths (the report then says which and when); without such
    results it stands alone."""
    path = RESULTS / "results.json"
    try:
        old: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return new
    if old["meta"]["config"]["sizes"] != new["meta"]["config"]["sizes"]:
        return new
    measured = [k for k in new if k not in ("meta", "errors", "seconds", "loadavg",
                                            "loadavg_start")]
    old.update({k: new[k] for k in measured})
    for section in ("seconds", "loadavg", "loadavg_start"):
        old.setdefault(section, {}).update(new.get(section, {}))
    old["errors"] = {k: v for k, v in old.get("errors", {}).items() if k not in measured}
    old["errors"].update(new["errors"])
    old["meta"].setdefault("updates", []).append({
        "date": new["meta"]["date"], "command": new["meta"]["command"],
        "commit": new["meta"]["commit"], "measured": measured,
        "loadavg": new["meta"]["loadavg_start"]})
    return old


def _phases(cfg: Config, urls: dict[str, str], rdb: RedisDb, logdir: Path,
            phase: Callable[..., Any], results: dict[str, Any]) -> None:
    from bench import floor, ours

    errors: dict[str, str] = results["errors"]
    lg: Any = None
    if {"langgraph", "langgraph-delta"} & set(cfg.systems):
        try:
            from bench import langgraph_bench as lg
        except ImportError as e:
            errors["langgraph"] = f"not installed (pip install -e '.[bench]'): {e!r}"
        else:
            results["meta"]["packages"].update(lg.versions())
    phase("floor", lambda: floor.bench_floor(urls["floor"], rdb.url, cfg.floor_samples))
    if "overhead" in cfg.phases:
        systems = _systems(cfg, urls, rdb, logdir, lg, errors)
        try:
            phase("overhead", lambda: results.update(interleaved_runs(
                systems, cfg.sizes, cfg.repeats, "run", errors)))
        finally:
            for system in systems:
                system.close()
        results.pop("overhead", None)
    if "load" in cfg.phases:
        _load_phases(cfg, urls, lg, phase, results)
    rdb.flush()
    phase("throughput", lambda: _throughput(cfg, urls, rdb, logdir, lg, errors))
    rdb.flush()
    phase("recovery", lambda: ours.bench_recovery(urls["tp"], rdb.url, cfg.recovery_repeats,
                                                  "rec", logdir))
    n = min(cfg.profile_laps, max(cfg.sizes))
    phase("profile", lambda: ours.profile_inprocess(urls["ours"], n, "prof",
                                                    RESULTS / "profile.html"))
    phase("profile", lambda: ours.sql_census(urls["ours"], n, "sql"), "sql_census")


def _systems(cfg: Config, urls: dict[str, str], rdb: RedisDb, logdir: Path, lg: Any,
             errors: dict[str, str]) -> list[System]:
    """Build each selected system (a failure is recorded and that system left out)."""
    from bench import floor, ours

    makers: dict[str, Callable[[], System]] = {
        "ours": lambda: ours.InProcess(urls["ours"]),
        "celery": lambda: ours.ViaCelery(urls["celery"], rdb.url, logdir),
        "bare-insert": lambda: floor.BareInsert(urls["floor"], rdb.url),
    }
    if lg is not None:
        makers["langgraph"] = lambda: lg.Graph(urls["langgraph"], "langgraph")
        makers["langgraph-delta"] = lambda: lg.Graph(urls["langgraph_delta"], "langgraph-delta")
    if "dbos" in cfg.systems:
        try:  # the optional [bench] extra; imported only when DBOS is measured
            from bench import dbos_bench
        except ImportError as e:
            errors["dbos"] = f"not installed (pip install -e '.[bench]'): {e!r}"
        else:
            makers["dbos"] = lambda: dbos_bench.Workflow(urls["dbos"])
    built: list[System] = []
    for name in cfg.systems:
        if name not in makers:
            continue
        try:
            built.append(makers[name]())
        except Exception as e:
            errors[name.replace("-", "_")] = "".join(traceback.format_exception(e))[-3000:]
            log(f"{name} could not start: {e!r}")
    return built


def _load_phases(cfg: Config, urls: dict[str, str], lg: Any, phase: Callable[..., Any],
                 results: dict[str, Any]) -> None:
    """Resume cost on the runs the overhead phase left behind."""
    from bench import ours

    for name in cfg.systems:
        key = name.replace("-", "_")
        runs = results.get(key)
        if name in ("celery", "bare-insert", "dbos") or not runs:
            continue
        ids = {n: runs[str(n)]["run_id"] for n in cfg.sizes if str(n) in runs}
        if name == "ours":
            phase("load", lambda ids=ids: ours.bench_load(urls["ours"], ids, cfg.load_samples),
                  "ours_load")
        elif lg is not None:
            phase("load", lambda ids=ids, name=name, key=key: lg.bench_load(
                urls[key], name, ids, cfg.load_samples), f"{key}_load")


def _throughput(cfg: Config, urls: dict[str, str], rdb: RedisDb, logdir: Path, lg: Any,
                errors: dict[str, str]) -> dict[str, Any]:
    """Laps/s at each process count, ours and LangGraph taking turns per count.

    Each system starts on an empty database of its own (``tp``, ``lg_tp``), as
    in ``bench.scaling``: LangGraph's overhead-phase database holds hundreds of
    megabytes of growing checkpoints by now, which slowed its 2-process rate
    by a few percent (BENCHMARKS.md, "Goal 5 on empty databases"), in ours'
    favour."""
    from bench import ours

    out: dict[str, dict[str, Any]] = {"ours": {}, "langgraph": {}}
    if lg is not None and "langgraph" in cfg.systems:
        lg.setup(urls["lg_tp"])
    for k in cfg.processes:
        try:
            out["ours"].update(ours.bench_throughput(
                urls["tp"], rdb.url, (k,), cfg.tp_runs, cfg.tp_laps, cfg.tp_repeats, "tp",
                logdir))
        except Exception as e:
            errors[f"throughput_ours_{k}"] = "".join(traceback.format_exception(e))[-3000:]
        rdb.flush()
        if lg is not None and "langgraph" in cfg.systems:
            try:
                out["langgraph"].update(lg.bench_throughput(
                    urls["lg_tp"], "langgraph", (k,), cfg.tp_runs, cfg.tp_laps,
                    cfg.tp_repeats, "lgtp"))
            except Exception as e:
                errors[f"throughput_langgraph_{k}"] = "".join(
                    traceback.format_exception(e))[-3000:]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
