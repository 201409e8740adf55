"""How long ``agent-worker --help`` and ``agent-worker --version`` take, wall
clock, best of three runs each (under a second on a 2-core machine).

    python -m bench.cli_startup [--runs 3] [--limit 1.0]

Runs the installed console script (the ``agent-worker`` next to this Python),
or ``python -m agent_worker.cli`` when there is none; exits 1 if a best time
is over ``--limit`` seconds. A timing depends on the machine and its load, so
it is measured here, not asserted by the test suite: tests/unit/test_cli_startup.py
checks the load-independent cause instead (neither command imports SQLAlchemy,
Celery or the API).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (["--help"], ["--version"])


def cli() -> list[str]:
    """The console script installed with this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "agent-worker"
    if script.exists():
        return [str(script)]
    found = shutil.which("agent-worker")
    return [found] if found else [sys.executable, "-m", "agent_worker.cli"]


def best_of(argv: list[str], runs: int) -> float:
    """The shortest wall-clock time of ``runs`` runs of ``argv``, in seconds."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per command (best is kept)")
    ap.add_argument("--limit", type=float, default=1.0, help="seconds a best time may take")
    a = ap.parse_args()
    base = cli()
    over = False
    for args in COMMANDS:
        best = best_of([*base, *args], a.runs)
        over = over or best > a.limit
        print(f"agent-worker {' '.join(args):<10} best of {a.runs}: {best:.3f} s"
              f"{'  OVER ' + str(a.limit) + ' s' if best > a.limit else ''}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
