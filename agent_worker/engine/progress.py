"""``ctx.heartbeat(progress=...)``: a long tool says it is alive and how far it got.

Each heartbeat renews the lap's lease at once (beyond the background renewal
of ``engine.heartbeat``, which only proves the process is alive), tells the
tool whether the lap must stop (it raises ``LeaseLost`` / ``RunCancelled`` in
the tool's thread), and records the progress as a ``progress`` event of the
lap: ``runs show`` displays the latest one per call while the lap runs.

Writes are throttled to one per call per ``PROGRESS_MIN_SECONDS``: a tool may
heartbeat in a tight loop without flooding the audit log. A progress value is
admitted like a tool result (cleaned, redacted, and bounded to
``PROGRESS_MAX_BYTES``) before it is stored.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from agent_worker.agent import Agent
from agent_worker.engine import admit
from agent_worker.engine.heartbeat import Heartbeat
from agent_worker.runtime import Runtime
from agent_worker.store.base import EventRecord

log = logging.getLogger(__name__)

#: Least time between two lease renewals, or two stored progress events, of one call.
PROGRESS_MIN_SECONDS = 1.0
#: Largest progress value kept (JSON bytes); a larger one is kept as its size and a prefix.
PROGRESS_MAX_BYTES = 4000
#: The event kind ``runs show`` reads.
PROGRESS_EVENT = "progress"


class CallBeat:
    """The heartbeat one call's ``ToolContext`` carries (``ToolContext.beat``)."""

    def __init__(self, rt: Runtime, agent: Agent, hb: Heartbeat, *, call_index: int,
                 tool: str) -> None:
        self.rt, self.agent, self.hb = rt, agent, hb
        self.call_index, self.tool = call_index, tool
        self._lock = threading.Lock()
        self._recorded = float("-inf")
        self._limits = rt.settings.model_copy(
            update={"max_tool_result_bytes": PROGRESS_MAX_BYTES})

    def __call__(self, progress: Any = None) -> None:
        now = time.monotonic()
        if now - self.hb.renewed >= PROGRESS_MIN_SECONDS:
            self.hb.renew()
        self.hb.check()
        if progress is None:
            return
        with self._lock:
            if now - self._recorded < PROGRESS_MIN_SECONDS:
                return
            self._recorded = now
        try:
            # Plain JSON first (a set, a datetime become text), then admitted.
            plain = json.loads(json.dumps(progress, default=str))
            kept = admit.tool_result(plain, self._limits, self.agent.redact)
            self.rt.store.record_event(
                self.hb.run_id, self.hb.lap, PROGRESS_EVENT,
                {"call": self.call_index, "tool": self.tool, "progress": kept},
                now=self.rt.clock.now())
        except Exception as e:
            # Progress is for people watching; a database blip or an odd value
            # must not fail the call that reported it.
            log.warning("progress of %s call %s not recorded: %s", self.tool,
                        self.call_index, admit.describe(e))


def latest(events: Iterable[EventRecord], lap: int) -> list[dict[str, Any]]:
    """The newest progress of each call of ``lap``, in call order, from a run's
    events (``EventRecord``s); what ``runs show`` prints for a lap in flight."""
    newest: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.kind == PROGRESS_EVENT and e.lap == lap and e.data is not None:
            newest[int(e.data.get("call", 0))] = {**e.data, "at": e.created_at}
    return [newest[k] for k in sorted(newest)]


__all__ = ["PROGRESS_EVENT", "PROGRESS_MAX_BYTES", "PROGRESS_MIN_SECONDS", "CallBeat",
           "latest"]
