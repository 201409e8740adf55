"""Lap overhead with Postgres row-level security on and off, side by side.

The same in-process runs as ``bench.run --only overhead`` (the shared workload,
``InProcessWorker`` on a fresh Postgres database), alternating between the
schema as migrated (RLS enabled and forced on every tenant-owned table) and the
same schema with RLS disabled, so every mode sees the same machine load. Laps
run in the system scope (``store.tenancy``), as workers do: what is measured is
the policies' evaluation on every statement of the lap, not a set_config.

Three modes, interleaved: ``rls_off`` (policies disabled: the baseline),
``rls_on`` (policies on, laps as the app role in the system scope: workers
without ``AGENT_WORKER_SYSTEM_DATABASE_URL``), and ``rls_system_role``
(policies on, laps as the system role with BYPASSRLS: workers with it). The
last is skipped, with a note, when that role cannot connect. Besides each
lap's wall time, the CPU time the Postgres backends used per lap (when the
server runs on this machine): what the policies cost the server, far less
disturbed by other load than the wall time.

    python -m bench.rls [--laps 20] [--repeats 30] [--system-role agent_worker_system]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy import make_url

from bench.common import RESULTS, create_database, drop_database, libpq_url, log, sa_url
from bench.ours import InProcess
from bench.workload import run_id

TABLES = ("runs", "checkpoints", "messages", "effects", "events", "approvals", "signals",
          "audit_log")


def set_rls(url: str, on: bool) -> None:
    """Enable (and force) or disable row-level security on every tenant-owned table."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for t in TABLES:
            if on:
                conn.execute(f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY")
                conn.execute(f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY")
            else:
                conn.execute(f"ALTER TABLE {t} NO FORCE ROW LEVEL SECURITY")
                conn.execute(f"ALTER TABLE {t} DISABLE ROW LEVEL SECURITY")


def system_role_url(url: str, role: str) -> str | None:
    """``url`` as ``role``, if that role can log in and bypasses row-level security."""
    as_role = libpq_url(make_url(sa_url(url)).set(username=role)
                        .render_as_string(hide_password=False))
    try:
        with psycopg.connect(as_role, autocommit=True) as conn:
            row = conn.execute("SELECT rolbypassrls FROM pg_roles "
                               "WHERE rolname = current_user").fetchone()
    except psycopg.OperationalError:
        return None
    return as_role if row is not None and row[0] else None


class BackendCpu:
    """CPU time the Postgres backends of one database have used, from
    ``/proc/<pid>/schedstat`` (nanoseconds on a CPU; the server must run on
    this machine). Unlike a lap's wall time it hardly moves with the machine's
    load, so it shows what the policies cost the server even on a busy machine.
    """

    def __init__(self, url: str, database: str) -> None:
        self.conn = psycopg.connect(libpq_url(url), autocommit=True)
        self.database = database

    def sample(self) -> dict[int, int]:
        pids = [r[0] for r in self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,))]
        out = {}
        for pid in pids:
            try:
                out[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # gone, or not on this machine
                continue
        return out

    @staticmethod
    def used_ns(before: dict[int, int], after: dict[int, int]) -> int:
        return sum(ns - before.get(pid, 0) for pid, ns in after.items())

    def close(self) -> None:
        self.conn.close()


def overheads(per_lap: dict[str, list[float]], what: str) -> dict[str, float]:
    """Each mode against ``rls_off``: medians, fastest runs, and the median of
    the per-repeat ratios (the modes of a repeat run back to back, so their
    ratio cancels most of a drift in the machine's load)."""
    out = {}
    for mode in [m for m in per_lap if m != "rls_off"]:
        suffix = "" if mode == "rls_on" else f"_{mode}"
        paired = statistics.median(x / off for x, off in zip(per_lap[mode], per_lap["rls_off"],
                                                               strict=True))
        med = statistics.median(per_lap[mode]) / statistics.median(per_lap["rls_off"])
        best = min(per_lap[mode]) / min(per_lap["rls_off"])
        out[f"{what}_overhead_pct_paired{suffix}"] = 100 * (paired - 1)
        out[f"{what}_overhead_pct_median{suffix}"] = 100 * (med - 1)
        out[f"{what}_overhead_pct_min{suffix}"] = 100 * (best - 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--laps", type=int, default=20, help="laps per run")
    p.add_argument("--repeats", type=int, default=30, help="runs per mode")
    p.add_argument("--system-role", default="agent_worker_system",
                   help="the BYPASSRLS role of AGENT_WORKER_SYSTEM_DATABASE_URL")
    args = p.parse_args(argv)
    name = f"aw_bench_rls_{int(time.time())}"
    url = create_database(name)
    system = bypass = None
    cpu: BackendCpu | None = None
    try:
        system = InProcess(sa_url(url))
        systems = {"rls_off": system, "rls_on": system}
        privileged = system_role_url(url, args.system_role)
        if privileged is None:
            log(f"rls_system_role skipped: role {args.system_role!r} cannot connect with "
                "BYPASSRLS (deploy/local/services.sh creates it)")
        else:
            bypass = InProcess(sa_url(privileged))
            systems["rls_system_role"] = bypass
        per_lap: dict[str, list[float]] = {m: [] for m in systems}
        cpu_per_lap: dict[str, list[float]] = {m: [] for m in systems}
        modes = list(systems)
        cpu = BackendCpu(url, name)
        for i in range(args.repeats):
            # Rotate which mode goes first, so a drift in load favours none.
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                set_rls(url, mode != "rls_off")
                before = cpu.sample()
                seconds = systems[mode].run(run_id(f"rls-{mode}-{i}", args.laps, i), args.laps)
                per_lap[mode].append(seconds * 1e3 / args.laps)
                cpu_per_lap[mode].append(cpu.used_ns(before, cpu.sample()) / 1e6 / args.laps)
                log(f"{mode} run {i}: {per_lap[mode][-1]:.3f} ms/lap, "
                    f"{cpu_per_lap[mode][-1]:.3f} ms of server CPU per lap")
        set_rls(url, True)
        result: dict[str, object] = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "laps": args.laps,
            "repeats": args.repeats, "load_average": list(os.getloadavg()),
            "ms_per_lap": per_lap, "server_cpu_ms_per_lap": cpu_per_lap,
            "median_ms_per_lap": {m: statistics.median(v) for m, v in per_lap.items()},
            # The fastest run of each mode is the one the machine's load disturbed least.
            "min_ms_per_lap": {m: min(v) for m, v in per_lap.items()},
            "median_server_cpu_ms_per_lap": {m: statistics.median(v)
                                             for m, v in cpu_per_lap.items()},
            **overheads(per_lap, "wall"), **overheads(cpu_per_lap, "server_cpu")}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "rls.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if cpu is not None:
            cpu.close()
        for one in (system, bypass):
            if one is not None:
                # All of its engines: the drop below may end only the app
                # role's own sessions, not the system role's.
                one.w.close()
        drop_database(name)


if __name__ == "__main__":
    raise SystemExit(main())
