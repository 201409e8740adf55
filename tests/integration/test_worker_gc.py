"""A real worker sets its garbage collector as ``tasks.garbage`` says.

Read through ``bench/gcprobe`` (first on the worker's ``PYTHONPATH``), which
writes the worker's ``gc.get_threshold()`` and ``gc.get_freeze_count()`` to
a file every 0.2 s, once the
worker says it is ready (``worker_init`` comes before that). Under prefork the
children inherit the main process's thresholds by fork; the probe runs in the
main process, which is where the laps of threads and solo run.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest

from bench.gc_worker import probe_env
from tests.support import Fleet, wait_for


def _collector(out: Path, pid: int) -> tuple[list[int], int]:
    """The worker's thresholds and how many objects it froze, as last written."""
    data = json.loads((out / f"{pid}.json").read_text())
    return list(data["threshold"]), int(data["frozen"])


#: This interpreter's own thresholds (a worker runs the same one).
PYTHONS = list(gc.get_threshold())


@pytest.mark.parametrize(("setting", "youngest", "frozen"), [
    (None, 10_000, True),  # the default
    ("2500", 2_500, True),
    ("0", PYTHONS[0], False),  # Python's own, untouched (a threshold of 0 would stop collecting)
])
def test_a_worker_freezes_its_start_up_heap_and_collects_as_configured(
        fleet: Fleet, tmp_path: Path, setting: str | None, youngest: int, frozen: bool) -> None:
    out = tmp_path / "gc"
    out.mkdir()
    env = probe_env(out, frozen=True)
    if setting is not None:
        env["AGENT_WORKER_WORKER_GC_THRESHOLD"] = setting
    worker = fleet.worker(concurrency=1, **env)
    wait_for(lambda: " ready." in worker.log.read_text(errors="replace"), 60,
             what="worker ready")
    ready_at = time.time()
    probe = out / f"{worker.pid}.json"
    wait_for(lambda: probe.exists() and probe.stat().st_mtime > ready_at, 10,
             what="the probe's file written after the worker was ready")
    thresholds, frozen_objects = _collector(out, worker.pid)
    assert thresholds == [youngest, *PYTHONS[1:]]
    # The start-up heap (Celery, SQLAlchemy, pydantic, the agents) is many
    # thousands of objects; unfrozen, none.
    assert (frozen_objects > 10_000) if frozen else (frozen_objects == 0)
