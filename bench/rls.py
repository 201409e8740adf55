"""Lap overhead with Postgres row-level security on and off, side by side (issue 16).

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
last is skipped, with a note, when that role cannot connect.

    python -m bench.rls [--laps 20] [--repeats 30] [--system-role agent_worker_system]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime

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
        modes = list(systems)
        for i in range(args.repeats):
            # Rotate which mode goes first, so a drift in load favours none.
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                set_rls(url, mode != "rls_off")
                seconds = systems[mode].run(run_id(f"rls-{mode}-{i}", args.laps, i), args.laps)
                per_lap[mode].append(seconds * 1e3 / args.laps)
                log(f"{mode} run {i}: {per_lap[mode][-1]:.3f} ms/lap")
        set_rls(url, True)
        med = {m: statistics.median(v) for m, v in per_lap.items()}
        best = {m: min(v) for m, v in per_lap.items()}
        # The fastest run of each mode is the one the machine's load disturbed least.
        result: dict[str, object] = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "laps": args.laps,
            "repeats": args.repeats, "load_average": list(os.getloadavg()),
            "ms_per_lap": per_lap, "median_ms_per_lap": med, "min_ms_per_lap": best}
        for mode in modes[1:]:
            suffix = "" if mode == "rls_on" else f"_{mode}"
            # Each repeat runs the modes back to back: the ratio within a
            # repeat cancels most of a drift in the machine's load.
            paired = statistics.median(on / off for on, off in zip(per_lap[mode],
                                                                      per_lap["rls_off"],
                                                                      strict=True))
            result[f"overhead_pct_paired{suffix}"] = 100 * (paired - 1)
            result[f"overhead_pct_median{suffix}"] = 100 * (med[mode] / med["rls_off"] - 1)
            result[f"overhead_pct_min{suffix}"] = 100 * (best[mode] / best["rls_off"] - 1)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "rls.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    finally:
        for one in (system, bypass):
            if one is not None:
                # All of its engines: the drop below may end only the app
                # role's own sessions, not the system role's.
                one.w.close()
        drop_database(name)


if __name__ == "__main__":
    raise SystemExit(main())
