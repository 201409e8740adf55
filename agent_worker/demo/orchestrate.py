"""The README's demo, end to end: a vendor, two workers, beat, Flower and the
run console on the configured Postgres and Redis; it submits refund-desk runs, SIGKILLs one worker
mid-run, starts a replacement, and shows every run finished with each lap
committed exactly once and every refund landed exactly once at the vendor.

By default the fleet stays up afterwards (the console, Flower, ``agent-worker
submit``, ``runs list`` work against it, and a ``goodwill-credit`` run waits in
the console's approvals inbox) until ``--stop``; ``--no-keep`` tears it down at the end.
Run it through ``deploy/local/demo.sh`` (which installs and starts services).
``AGENT_WORKER_DEMO_RUNS`` sets the default number of runs (tests use fewer).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from agent_worker.api import AgentWorker, client
from agent_worker.console.users import hash_password
from agent_worker.core.settings import get_settings
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.demo import goodwill
from agent_worker.demo.fleet import Fleet, stop_saved
from agent_worker.demo.vendor import VendorProcess, start_vendor
from agent_worker.store.base import RunRecord

FLEET_FILE = Path(".data/demo-fleet.json")
CONSOLE_USER = "demo"
PROGRESS_EVERY = 2.0  # seconds: no silent wait longer than this


def _laps_once(aw: AgentWorker, run_id: str) -> bool:
    run = aw.get_run(run_id)
    laps = [c[0] for c in aw.checkpoints(run_id)]
    commits = Counter(e.lap for e in aw.events(run_id) if e.kind == "lap_committed")
    return laps == list(range(run.lap + 1)) and all(v == 1 for v in commits.values()) \
        and len(commits) == run.lap


def _wait(aw: AgentWorker, runs: list[str], what: str,
          until: Callable[[list[RunRecord]], bool], timeout: float) -> list[RunRecord]:
    """Poll the runs until ``until`` holds, printing their progress as the wait
    begins and every couple of seconds after, so the demo never goes quiet."""
    start = time.monotonic()
    last = start - PROGRESS_EVERY
    while True:
        records = [aw.get_run(r) for r in runs]
        if until(records):
            return records
        progress = _progress(records)
        now = time.monotonic()
        if now - start > timeout:
            raise SystemExit(f"demo: {what} did not happen within {timeout:.0f}s ({progress}); "
                             "see the worker logs")
        if now - last >= PROGRESS_EVERY:
            print(f"  ... {now - start:4.0f}s {progress}", flush=True)
            last = now
        time.sleep(0.2)


def _progress(records: list[RunRecord]) -> str:
    finished = sum(r.status in TERMINAL for r in records)
    return (f"{finished}/{len(records)} runs finished, {sum(r.lap for r in records)} laps "
            f"committed, {sum(r.recoveries for r in records)} recovered")


def _run_demo(aw: AgentWorker, fleet: Fleet, vendor: VendorProcess, runs_wanted: int) -> bool:
    runs = [aw.start_run("refund-desk", {"orders": 6}).id for _ in range(runs_wanted)]
    print(f"submitted {len(runs)} refund-desk runs", flush=True)
    _wait(aw, runs, "three laps per run", lambda b: sum(r.lap for r in b) >= 3 * len(b), 60)
    pid = fleet.kill("worker1")
    print(f"SIGKILLed worker 1 (pid {pid}) mid-run; starting a replacement; the runs it "
          "held resume once their lease expires (AGENT_WORKER_LEASE_TTL_SECONDS)", flush=True)
    fleet.worker(3)
    finished = _wait(aw, runs, "every run finishing",
                     lambda b: all(r.status in TERMINAL for r in b), 300)
    stats = vendor.client.stats()
    ok = True
    print(f"{'run':34} {'status':10} {'laps':>4} {'recovered':>9}  each lap once")
    for run in finished:
        once = _laps_once(aw, run.id)
        ok &= once and run.status == "succeeded"
        print(f"{run.id:34} {run.status:10} {run.lap:>4} {run.recoveries:>9}  {once}")
    print(f"vendor: {stats['refunds']} refunds, {stats['notices']} notices, "
          f"{stats['duplicates']} duplicates")
    ok &= bool(stats["duplicates"] == 0 and stats["refunds"] == 6 * len(runs))
    print("demo OK: every run finished, every lap committed once, no refund twice" if ok
          else "demo FAILED")
    return ok


def _print_kept(fleet: Fleet, flower: str, auth: str, console: str, password: str) -> None:
    """The demo's last lines: how to stop the fleet, then where to look, the
    console last (what a newcomer opens first)."""
    print(f"""
The fleet is still running, so you can look around. Stop it with
  deploy/local/demo.sh --stop     (workers, beat, Flower, the console, the demo's vendor)
  deploy/local/services.sh stop   (Postgres, Redis and the vendor of services.sh)
Where to look:
  logs       {fleet.logdir}
  runs       agent-worker runs list   |   agent-worker runs show RUN --laps
  a new run  agent-worker submit refund-desk --wait
  Flower     {flower}  (user:password {auth}, also in .data/flower-auth);
             search kwargs:run_id=<id> under Tasks
  Console    {console}  (user {CONSOLE_USER}, password {password}, also in
             .data/console-auth): the runs, their laps and effects, and a
             goodwill-credit run waiting for your approval under Approvals""")


def _serving(url: str, timeout: float = 30.0) -> bool:
    """Whether ``url`` answers 200 within ``timeout`` seconds (the console's
    readiness probe), so the demo never prints the address of a dead console."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if int(resp.status) == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def _console_env(password: str, flower: str) -> dict[str, str]:
    """The console's settings: one admin user across tenants (the demo's runs
    belong to the single-tenant default), also in the goodwill approvers' group."""
    user = {"id": CONSOLE_USER, "tenant": "*", "roles": ["admin", goodwill.OWNER],
            "password_hash": hash_password(password)}
    return {"AGENT_WORKER_CONSOLE_USERS": json.dumps([user]),
            "AGENT_WORKER_CONSOLE_FLOWER_URL": flower}


def _save_auth(path: Path, auth: str) -> None:
    """Keep the demo Flower's ``user:password`` where the README's curl reads it
    (``.data/flower-auth``), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(auth)
    path.chmod(0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int,
                        default=int(os.environ.get("AGENT_WORKER_DEMO_RUNS", "5")))
    parser.add_argument("--flower-port", type=int, default=5555)
    parser.add_argument("--console-port", type=int, default=8090)
    parser.add_argument("--keep", action=argparse.BooleanOptionalAction, default=True,
                        help="Leave the fleet running after the demo (default).")
    parser.add_argument("--stop", action="store_true",
                        help="Stop the fleet a previous demo left running, and exit.")
    parser.add_argument("--fleet-file", type=Path, default=FLEET_FILE,
                        help="Where the kept fleet's pids are recorded.")
    opts = parser.parse_args(argv)
    stopped = stop_saved(opts.fleet_file)
    if stopped or opts.stop:
        print(f"stopped the demo fleet: {', '.join(stopped)}" if stopped
              else "no demo fleet was running")
    if opts.stop:
        return 0
    logdir = Path(tempfile.mkdtemp(prefix="agent-worker-demo-"))
    vendor = start_vendor(logdir / "vendor.db")
    # A fresh random password per demo (never a fixed one), printed below and
    # saved in .data/flower-auth for the README's curl. Flower listens on loopback.
    auth = os.environ.get("FLOWER_BASIC_AUTH") or f"demo:{secrets.token_urlsafe(12)}"
    _save_auth(opts.fleet_file.parent / "flower-auth", auth)
    password = secrets.token_urlsafe(12)
    _save_auth(opts.fleet_file.parent / "console-auth", f"{CONSOLE_USER}:{password}")
    # The workers and the console also load the goodwill agent the demo leaves waiting.
    modules = f"{get_settings().agent_modules},{goodwill.__name__}"
    env = {**os.environ, "AGENT_WORKER_VENDOR_URL": vendor.url, "FLOWER_BASIC_AUTH": auth,
           "AGENT_WORKER_AGENT_MODULES": modules}
    fleet = Fleet(logdir, env, extra_pids={"vendor": vendor.pid or 0})
    flower = f"http://127.0.0.1:{opts.flower_port}"
    console = f"http://127.0.0.1:{opts.console_port}"
    kept = False
    try:
        fleet.worker(1)
        fleet.worker(2)
        fleet.spawn("beat", ["-m", "celery", "-A", "agent_worker.tasks", "beat", "-s",
                             str(logdir / "beat.db")])
        fleet.spawn("flower", ["-m", "celery", "-A", "agent_worker.tasks", "flower",
                               f"--port={opts.flower_port}", "--address=127.0.0.1"])
        fleet.spawn("console", ["-m", "agent_worker.cli", "console", "--host", "127.0.0.1",
                                "--port", str(opts.console_port)],
                    extra_env=_console_env(password, flower))
        print(f"logs in {logdir}; Flower on {flower} (user:password {auth}); "
              f"console on {console}", flush=True)
        aw = client()
        ok = _run_demo(aw, fleet, vendor, opts.runs)
        if not _serving(f"{console}/healthz"):
            print(f"demo: the console did not come up; see {logdir / 'console.log'}")
            ok = False
        if opts.keep:
            aw.start_run(goodwill.goodwill_credit.name, {"order_id": "ord-042"})
            fleet.save(opts.fleet_file, flower=flower, console=console)
            kept = True
            _print_kept(fleet, flower, auth, console, password)
    finally:
        if not kept:
            fleet.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
