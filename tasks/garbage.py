"""A worker's cyclic garbage collector, set for a long-lived process of many laps.

With Python's defaults (a collection of the youngest generation every 700 net
allocations of container objects) a busy IO-bound threads worker spent about a
tenth of its CPU collecting, and most of that in full collections, each
scanning the whole heap while holding the GIL for 100-350 ms: every lap of the
process, and its lease heartbeat, stood still meanwhile (BENCHMARKS.md, "The
worker's garbage collector"). Most of a lap's objects live for the lap; with a
youngest generation of 10,000 allocations (``AGENT_WORKER_WORKER_GC_THRESHOLD``)
they die there instead of being promoted, so the older generations, and the
full collections that scan them, come far less often.

Not ``gc.freeze()`` of the start-up heap as well, the other usual remedy:
with the youngest generation at 10,000 no full collection is left for it to
shorten, and measured it changed neither the collector's CPU (0.12 against
0.13 ms a lap) nor the worker's beyond the runs' spread (same section).

Set on ``worker_init``, in the worker's main process before a prefork pool
forks (its children inherit the thresholds); under threads and solo the laps
run in that same process.
"""

from __future__ import annotations

import gc
from typing import Any

from celery.signals import worker_init

from agent_worker.settings import get_settings


def tune(threshold: int) -> None:
    """Collect the youngest generation every ``threshold`` allocations; 0
    leaves Python's collector as it is. The other two thresholds stay the
    interpreter's own (their meaning changed with 3.14's incremental
    collector; the youngest generation's did not)."""
    if threshold:
        _, *older = gc.get_threshold()
        gc.set_threshold(threshold, *older)


@worker_init.connect
def _tune_worker(**_: Any) -> None:
    tune(get_settings().worker_gc_threshold)
