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

The heap the worker starts with (modules, the Celery app, the agents: nothing
a lap frees) is also frozen (``gc.freeze()``, after one full collection so no
garbage is frozen for good): no collection walks it again. Under threads that
changed nothing measurable; under prefork it is what keeps the children's
copies of the parent's pages shared, since a full collection in a child
writes to every object it walks: measured, 46-47 MB of private memory per
child against 74 MB (same section).

Set on ``worker_init``, in the worker's main process before a prefork pool
forks (its children inherit the frozen heap and the thresholds); under
threads and solo the laps run in that same process.
"""

from __future__ import annotations

import gc
from typing import Any

from celery.signals import worker_init

from agent_worker.core.settings import get_settings


def tune(threshold: int) -> None:
    """Freeze the heap as it is and collect the youngest generation every
    ``threshold`` allocations; 0 leaves Python's collector as it is. The
    other two thresholds stay the interpreter's own (their meaning changed
    with 3.14's incremental collector; the youngest generation's did not)."""
    if threshold:
        gc.collect()
        gc.freeze()
        _, *older = gc.get_threshold()
        gc.set_threshold(threshold, *older)


@worker_init.connect
def _tune_worker(**_: Any) -> None:
    tune(get_settings().worker_gc_threshold)
