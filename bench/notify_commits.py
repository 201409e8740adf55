"""Commits per second with every event notifying, and with only followed runs'
events notifying (migration ``0023_notify_followed``): ``python -m
bench.notify_commits``.

Postgres commits a transaction that sent a ``NOTIFY`` under one lock for the
whole cluster, held through the commit's WAL flush, so notifying commits go
one flush at a time, where others share a flush (group commit). Every lap
commit inserts an event, and the event trigger notified for every event
until ``0023``. This measures that alone, without Python or Celery in the
way: ``pgbench`` clients each commit what a lap commit writes to the run and
its log in small (the run row updated, one event inserted) for a random run
of ``--runs``, on one database taken to ``0022`` (every event notifies) and
to ``0023`` (nobody follows these runs: none does), the two taking turns.
Prints commits per second, medians and ranges, per client count.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from alembic import command

from agent_worker.core.messages import Message
from agent_worker.store.base import NewRun
from agent_worker.store.migrate import alembic_config, upgrade
from agent_worker.store.sql import SqlStore
from agent_worker.store.tenancy import SETTING, SYSTEM
from bench.common import create_database, drop_database, log, sa_url, spread

DB = "bench_notify_commits"
VARIANTS = {"every event notifies (0022)": "0022_lap_columns_last",
            "followed runs only (0023)": "0023_notify_followed"}
SCRIPT = """\\set r random(1, {runs})
BEGIN;
UPDATE runs SET lap_attempts = lap_attempts WHERE id = 'nc-' || :r;
INSERT INTO events (run_id, lap, kind, data, created_at)
  VALUES ('nc-' || :r, 1, 'probe', NULL, now());
COMMIT;
"""


def _pgbench() -> str:
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                            check=True).stdout.strip()
    return str(Path(bindir) / "pgbench")


def _tps(url: str, script: Path, clients: int, seconds: int) -> float:
    """One ``pgbench`` run's commits per second."""
    out = subprocess.run(
        [_pgbench(), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
         "-T", str(seconds), "-f", str(script), url], capture_output=True, text=True,
        check=True, env={**os.environ, "PGOPTIONS": f"-c {SETTING}={SYSTEM}"}).stdout
    found = re.search(r"tps = ([0-9.]+)", out)
    if found is None:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.notify_commits", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--runs", type=int, default=1000, help="runs the commits spread over")
    p.add_argument("--seconds", type=int, default=10, help="length of one pgbench run")
    p.add_argument("--repeats", type=int, default=3, help="turns per variant and client count")
    args = p.parse_args(argv)
    url = create_database(DB)
    load_before = os.getloadavg()
    results: dict[tuple[str, int], list[float]] = {}
    try:
        upgrade(sa_url(url))
        store = SqlStore(sa_url(url))
        now = datetime.now(UTC)
        for i in range(1, args.runs + 1):
            store.create_run(NewRun(
                id=f"nc-{i}", tenant=None, agent_name="nc", agent_version="1", input={},
                limits={}, retention="full", checkpoint={"schema_version": 2,
                                                         "message_count": 1},
                schema_version=2, messages=[Message(role="user", content="task")], now=now))
        store.dispose()
        config = alembic_config(sa_url(url))
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "commit.sql"
            script.write_text(SCRIPT.format(runs=args.runs))
            names = list(VARIANTS)
            for repeat in range(args.repeats):
                for name in names if repeat % 2 == 0 else names[::-1]:
                    if name == names[0]:
                        command.downgrade(config, VARIANTS[name])
                    else:
                        command.upgrade(config, VARIANTS[name])
                    for clients in (int(c) for c in args.clients.split(",")):
                        tps = _tps(url, script, clients, args.seconds)
                        results.setdefault((name, clients), []).append(tps)
                        log(f"{name}, {clients} clients: {tps:.0f} commits/s")
    finally:
        drop_database(DB)
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"pgbench, {args.seconds} s a run, {args.repeats} runs a cell, "
          f"{args.runs} runs' rows; commits/s, median (min-max)")
    clients_list = [int(c) for c in args.clients.split(",")]
    print("| trigger | " + " | ".join(f"{c} clients" for c in clients_list) + " |")
    print("|---" * (len(clients_list) + 1) + "|")
    for name in VARIANTS:
        print(f"| {name} | " + " | ".join(spread(results[(name, c)]) for c in clients_list)
              + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
