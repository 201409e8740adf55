"""Times a process's cyclic garbage collections (``bench.gc_worker``).

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry
holding one, so a process whose ``PYTHONPATH`` starts with this directory runs
this (and not any other ``sitecustomize`` of the installation). It does
nothing unless ``AGENT_WORKER_BENCH_GC_DIR`` names a directory; then every
collection is timed through ``gc.callbacks`` (the collecting thread's CPU, and
the wall time from start to end: while it holds the GIL, the pause every other
thread of the process sees), and the totals per generation, with the end time
(``time.time()``) and length of every collection longer than 5 ms, are
written to ``<dir>/<pid>.json`` every 0.2 s by a daemon thread (with
``AGENT_WORKER_BENCH_GC_FROZEN`` set, the count of frozen objects too).
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from typing import Any

_OUT = os.environ.get("AGENT_WORKER_BENCH_GC_DIR")
_FROZEN = bool(os.environ.get("AGENT_WORKER_BENCH_GC_FROZEN"))


class _Collections:
    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.cpu_s = [0.0, 0.0, 0.0]
        self.long: list[tuple[float, float]] = []  # (ended at, seconds) of those > 5 ms
        self._started: dict[int, tuple[float, float]] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = (time.thread_time(), time.perf_counter())
            return
        started = self._started.pop(me, None)
        if started is None:
            return
        generation = int(info["generation"])
        self.count[generation] += 1
        self.cpu_s[generation] += time.thread_time() - started[0]
        took = time.perf_counter() - started[1]
        if took > 0.005:
            self.long.append((time.time(), took))

    def write(self, path: str) -> None:
        data: dict[str, Any] = {"count": self.count, "cpu_s": self.cpu_s, "long": self.long,
                                "threshold": list(gc.get_threshold())}
        if _FROZEN:
            # Only on request: it walks every frozen object under the GIL, which
            # cost a worker that froze its heap 1-2 ms a lap at this rate.
            data["frozen"] = gc.get_freeze_count()
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)


def _keep_writing(collections: _Collections, path: str) -> None:
    while True:
        collections.write(path)
        time.sleep(0.2)


if _OUT:
    _collections = _Collections()
    gc.callbacks.append(_collections)
    threading.Thread(target=_keep_writing, args=(_collections, f"{_OUT}/{os.getpid()}.json"),
                     name="gc-probe", daemon=True).start()
