"""Built-in tools that pause a run instead of doing work: durable timers and
waiting for a signal. The engine handles them itself; their functions only
describe the arguments to the model. Give them to an agent like any tool.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from agent_worker.tools import Tool, tool


def _sleep(seconds: float | None = None, until: datetime | None = None) -> None:
    """Pause the run for `seconds` or until the ISO time `until`; no process waits."""


def _wait_for_signal(name: str, timeout_seconds: float | None = None) -> None:
    """Pause until the named signal arrives (or the timeout passes); returns its payload."""


sleep_tool: Tool = replace(tool(name="sleep")(_sleep), control="sleep")
wait_for_signal_tool: Tool = replace(
    tool(name="wait_for_signal")(_wait_for_signal), control="signal"
)
