"""A Celery fleet of our own for one benchmark variant: its own database, its own
Redis database, a client that sends through its own Celery app, and workers
started with the variant's environment (pool, concurrency, task events).

Several fleets live side by side in one benchmark so their runs can take turns
(a burst of load on this shared machine then hits every variant alike), and
none of them can take another's lap messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from celery import Celery

from agent_worker.api import AgentWorker
from agent_worker.runtime import Runtime
from agent_worker.store.migrate import upgrade
from agent_worker.store.sql import SqlStore
from agent_worker.tasks.dispatch import CeleryDispatcher
from bench.common import ROOT, Proc, RedisDb, create_database, drop_database, sa_url, settings_from
from bench.ours import Deferred
from tests.support import process_stats

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_by_name(names: tuple[str, ...]) -> dict[int, tuple[str, float]]:
    """Every running process whose name is one of ``names``: its name and CPU
    seconds so far, by pid. The difference of two such readings
    (``cpu_since``) is what those processes spent in between."""
    wanted = {name.encode(): name for name in names}
    return {pid: (wanted[name], (int(fields[11]) + int(fields[12])) / _TICKS)
            for pid, name, fields in process_stats() if name in wanted}


def cpu_since(before: Mapping[int, tuple[str, float]],
              after: Mapping[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by process name between two ``cpu_by_name`` readings: a
    process that started in between counts whole; one that ended in between
    is lost (its last seconds are not in ``after``), so a figure errs low."""
    spent: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        earlier = before.get(pid)
        base = earlier[1] if earlier is not None and earlier[0] == name else 0.0
        spent[name] = spent.get(name, 0.0) + max(0.0, seconds - base)
    return spent


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot
    (``/proc/stat``: user, nice, system, irq and softirq; idle, iowait and
    time stolen by the hypervisor are not this machine's work)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / _TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _package(tree: Path, name: str) -> str:
    """``tree``'s import name of its ``store`` or ``tasks`` folder: under
    ``agent_worker`` since the embedding change, top-level in trees before it,
    which a comparison (``--trees``) may still run."""
    return f"agent_worker.{name}" if (tree / "agent_worker" / name).exists() else name


def _upgrade(url: str, tree: Path) -> None:
    """Migrate ``url`` to ``tree``'s schema: a tree compared with this one
    (``bench.tree_throughput``) runs on its own migrations, not on this
    tree's, or a change of schema would be measured in both."""
    if tree.resolve() == ROOT.resolve():
        upgrade(url)
        return
    subprocess.run([sys.executable, "-c", "import sys; "
                    f"from {_package(tree, 'store')}.migrate import upgrade; upgrade(sys.argv[1])",
                    url],
                   cwd=tree, check=True,
                   env={**os.environ, "PYTHONPATH": str(tree)})


class BenchFleet:
    """One variant's fleet. ``env`` holds its ``AGENT_WORKER_*`` settings."""

    def __init__(self, name: str, env: Mapping[str, str], logdir: Path,
                 agent_modules: str = "bench.agents", tree: Path = ROOT) -> None:
        self.name, self.logdir, self.tree = name, logdir, tree
        self.db = f"bench_{name.replace('-', '_')}"
        self.url = create_database(self.db)
        _upgrade(sa_url(self.url), tree)
        self.redis = RedisDb().__enter__()
        base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WORKER_")}
        self.env = {**base, "PYTHONPATH": str(tree),
                    "AGENT_WORKER_DATABASE_URL": sa_url(self.url),
                    "AGENT_WORKER_BROKER_URL": self.redis.url,
                    "AGENT_WORKER_AGENT_MODULES": agent_modules, **env}
        # The client only sends first laps: a bare app on this fleet's broker, JSON only.
        app = Celery(f"client-{name}", broker=self.redis.url, set_as_current=False)
        app.conf.update(task_serializer="json", accept_content=["json"])
        self.deferred = Deferred(CeleryDispatcher(app))
        self.store = SqlStore(sa_url(self.url))
        self.aw = AgentWorker(Runtime(store=self.store, dispatcher=self.deferred,
                                      settings=settings_from(self.env)))
        self.workers: list[Proc] = []

    def worker(self, concurrency: int, loglevel: str | None = None, **env: str) -> Proc:
        """Start ``celery -A agent_worker.tasks worker``; the pool comes from the fleet's env
        (``AGENT_WORKER_WORKER_POOL``), as in a deployment. Workers log at
        WARNING (``$BENCH_LOGLEVEL`` to compare: INFO writes two lines a lap),
        or at ``loglevel`` for a benchmark that reads the log."""
        n = len(self.workers)
        args = [sys.executable, "-m", "celery", "-A", _package(self.tree, "tasks"), "worker",
                "--loglevel", loglevel or os.environ.get("BENCH_LOGLEVEL", "WARNING"),
                "--concurrency", str(concurrency),
                "--without-mingle", "--without-gossip", "-n", f"{self.name}-{n}-{os.getpid()}@%h"]
        proc = Proc(args, {**self.env, **env}, self.logdir / f"{self.name}-{n}.log",
                    cwd=self.tree).start()
        self.workers.append(proc)
        return proc

    def pids(self) -> tuple[list[int], list[int]]:
        """The workers' main processes and their pool children."""
        mains = [p.pid for p in self.workers if p.alive()]
        return mains, [c for p in self.workers if p.alive() for c in p.children()]

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the main processes and of the pool children."""
        mains, children = self.pids()
        return sum(map(cpu_seconds, mains)), sum(map(cpu_seconds, children))

    def rss(self) -> int:
        mains, children = self.pids()
        return sum(map(rss_bytes, mains + children))

    def stop_workers(self) -> None:
        for p in self.workers:
            p.stop()
        self.workers.clear()

    def close(self) -> None:
        self.stop_workers()
        self.store.dispose()
        self.redis.__exit__()
        drop_database(self.db)
