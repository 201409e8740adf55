"""The README's demo, end to end: a vendor, two workers, beat and Flower on the
configured Postgres and Redis; it submits refund-desk runs, SIGKILLs one worker
mid-run, starts a replacement, and shows every run finished with each lap
committed exactly once and every refund landed exactly once at the vendor.

Run it through ``deploy/local/demo.sh`` (which installs and starts services).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from agent_worker.api import AgentWorker, client
from agent_worker.demo.vendor import start_vendor


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _worker(env: dict[str, str], logdir: Path, n: int) -> subprocess.Popen[bytes]:
    return _spawn([sys.executable, "-m", "celery", "-A", "tasks", "worker", "--loglevel",
                   "INFO", "--concurrency", "2", "-n", f"demo{n}@%h", "--without-mingle"],
                  env, logdir / f"worker{n}.log")


def _laps_once(aw: AgentWorker, run_id: str) -> bool:
    run = aw.get_run(run_id)
    laps = [c[0] for c in aw.checkpoints(run_id)]
    commits = Counter(e.lap for e in aw.events(run_id) if e.kind == "lap_committed")
    return laps == list(range(run.lap + 1)) and all(v == 1 for v in commits.values()) \
        and len(commits) == run.lap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--flower-port", type=int, default=5555)
    opts = parser.parse_args(argv)
    logdir = Path(tempfile.mkdtemp(prefix="agent-worker-demo-"))
    procs: list[subprocess.Popen[bytes]] = []
    with start_vendor(logdir / "vendor.db") as vendor:
        env = {**os.environ, "AGENT_WORKER_VENDOR_URL": vendor.url,
               "FLOWER_BASIC_AUTH": os.environ.get("FLOWER_BASIC_AUTH", "demo:demo")}
        os.environ["AGENT_WORKER_VENDOR_URL"] = vendor.url
        try:
            procs += [_worker(env, logdir, 1), _worker(env, logdir, 2)]
            procs.append(_spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat",
                                 "-s", str(logdir / "beat.db")], env, logdir / "beat.log"))
            procs.append(_spawn([sys.executable, "-m", "celery", "-A", "tasks", "flower",
                                 f"--port={opts.flower_port}"], env, logdir / "flower.log"))
            print(f"logs in {logdir}; Flower on http://127.0.0.1:{opts.flower_port} "
                  f"(user:password {env['FLOWER_BASIC_AUTH']})")
            aw = client()
            runs = [aw.start_run("refund-desk", {"orders": 6}).id for _ in range(opts.runs)]
            print(f"submitted {len(runs)} refund-desk runs")
            deadline = time.monotonic() + 60
            while sum(aw.get_run(r).lap for r in runs) < 3 * len(runs):
                if time.monotonic() > deadline:
                    raise SystemExit("demo: runs are not progressing; see the worker logs")
                time.sleep(0.2)
            os.killpg(procs[0].pid, signal.SIGKILL)
            print(f"SIGKILLed worker 1 (pid {procs[0].pid}) mid-run; starting a replacement")
            procs.append(_worker(env, logdir, 3))
            finished = [aw.wait(r, timeout=300) for r in runs]
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        stats = vendor.client.stats()
    ok = True
    print(f"{'run':34} {'status':10} {'laps':>4} {'recovered':>9}  each lap once")
    for run in finished:
        once = _laps_once(aw, run.id)
        ok &= once and run.status == "succeeded"
        print(f"{run.id:34} {run.status:10} {run.lap:>4} {run.recoveries:>9}  {once}")
    print(f"vendor: {stats['refunds']} refunds, {stats['notices']} notices, "
          f"{stats['duplicates']} duplicates")
    ok &= stats["duplicates"] == 0 and stats["refunds"] == 6 * len(runs)
    print("demo OK: every run finished, every lap committed once, no refund twice" if ok
          else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
