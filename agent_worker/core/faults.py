"""Named fault points for crash tests, compiled into production code.

A point fires only when the environment names it, so production pays one dict
lookup. ``AGENT_WORKER_FAULTS="after_intent,after_apply*2"`` kills the process
(SIGKILL, like the OOM killer) the first time (or the first two times) any
process reaches that point; ``AGENT_WORKER_FAULT_DIR`` holds marker files so
"the first time" is shared by every worker process of a test. A point may be
scoped to one tool with ``after_apply@refund``.
"""

from __future__ import annotations

import os
import signal
from functools import lru_cache
from pathlib import Path

POINTS = (
    "after_claim",
    "after_model_journal",
    "after_intent",
    "after_apply",
    "after_outcome",
    "after_commit",
    "in_compensation",
)


@lru_cache(maxsize=1)
def _armed() -> dict[str, int]:
    spec = os.environ.get("AGENT_WORKER_FAULTS", "")
    armed: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, times = item.partition("*")
        armed[name] = int(times or 1)
    return armed


def fault(point: str, *, scope: str | None = None) -> None:
    """Die here if a test armed ``point`` (optionally ``point@scope``)."""
    armed = _armed()
    if not armed:
        return
    for name in (point, f"{point}@{scope}" if scope else None):
        if name is None or name not in armed:
            continue
        directory = Path(os.environ.get("AGENT_WORKER_FAULT_DIR", "/tmp/agent-worker-faults"))
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(armed[name]):
            try:
                fd = os.open(directory / f"{name}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
