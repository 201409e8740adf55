"""The one workload every measured system runs, so the figures compare durability
layers and nothing else.

A run is ``n`` laps. Laps 1..n-1 each produce an assistant turn (about 600
bytes: prose plus one ``read`` tool call) and a tool result (about 400 bytes of
prose); lap ``n`` is the final answer (an assistant turn, no call). Each lap also
updates a small state: the lap counter, a plan of five items and a budget
ledger. The model is scripted and instant and the tool does nothing, so all
measured time is the framework's: the text is drawn once per seed and kept
(``prose``), so no system's lap pays for generating its own workload (drawn
afresh, the two texts of a lap cost about 75 us of CPU, and LangGraph's plan
another 50).

Text is drawn from a fixed vocabulary by a seeded generator: it compresses like
prose (Postgres TOAST compresses large values), unlike repeated filler that
would flatter whichever system stores more copies of it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

SIZES: tuple[int, ...] = (50, 200, 500)
"""Run lengths (laps) measured by default."""
QUICK_SIZES: tuple[int, ...] = (20, 60)
"""Run lengths of ``--quick`` smoke runs."""

ASSISTANT_TEXT_CHARS = 540
"""Assistant prose per lap; with the tool call the turn is about 600 bytes."""
TOOL_TEXT_CHARS = 380
"""Tool output per lap; with its envelope the result is about 400 bytes."""
PLAN_ITEMS = 5
TOOL_NAME = "read"
USAGE = (100, 20)
"""Tokens the scripted model reports per turn (input, output)."""
AGENT_NAME = "bench"

_TEXT = (
    "the run resumes from its last checkpoint after a worker dies and the lease expires "
    "while the sweeper sends the lap again so nothing is lost and no refund lands twice "
    "customer order invoice shipment warehouse ticket account balance ledger payment "
    "approval policy window message tool result model answer plan step budget token cost "
    "check verify compare summarise decide escalate archive note update review draft "
    "because however therefore meanwhile although unless until before after during "
    "quickly carefully exactly roughly nearly almost never always often sometimes "
    "green blue amber red small large early late first second third final pending "
    "applied failed retried recovered paused queued running finished committed fenced"
)
_WORDS = _TEXT.split()


@cache
def prose(seed: str, length: int) -> str:
    """``length`` characters of deterministic word salad for ``seed`` (kept: seeds
    name a lap, not a run, so every run shares about two texts per lap)."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


@dataclass(frozen=True)
class LapSpec:
    """What lap ``lap`` of an ``n``-lap run produces, for any system."""

    lap: int
    n: int
    text: str
    call_args: dict[str, Any] | None

    @property
    def final(self) -> bool:
        return self.call_args is None


def lap_spec(lap: int, n: int) -> LapSpec:
    """The scripted model's turn for ``lap`` of an ``n``-lap run."""
    if lap >= n:
        return LapSpec(lap, n, prose(f"final-{n}", ASSISTANT_TEXT_CHARS), None)
    return LapSpec(lap, n, prose(f"assistant-{lap}", ASSISTANT_TEXT_CHARS),
                   {"path": f"notes/lap-{lap:04d}.md"})


def tool_output(path: str) -> str:
    """What the ``read`` tool returns for ``path``: fixed prose, no I/O."""
    return prose(f"tool-{path}", TOOL_TEXT_CHARS)


def plan(lap: int) -> list[dict[str, Any]]:
    """The plan after ``lap``: five items, the first ``lap % 6`` done."""
    return [{"title": f"step {i + 1}: " + prose(f"plan-{i}", 40), "done": i < lap % 6}
            for i in range(PLAN_ITEMS)]


def ledger(lap: int) -> dict[str, Any]:
    """The budget ledger after ``lap`` laps (what LangGraph's state carries;
    agent-worker keeps its own, of the same shape)."""
    return {"laps": lap, "input_tokens": USAGE[0] * lap, "output_tokens": USAGE[1] * lap,
            "cost": f"{lap * 0.00042:.6f}", "started_at": "2026-01-01T00:00:00+00:00",
            "deadline": None}


_N = re.compile(r"-n(\d+)-")


def run_id(prefix: str, n: int, index: int) -> str:
    """A run (thread) id that carries its length, so any worker process can
    script the run from the id alone."""
    return f"{prefix}-n{n}-{index:04d}"


def laps_of(run_or_thread_id: str) -> int:
    """The run length encoded by ``run_id``."""
    found = _N.search(run_or_thread_id)
    if found is None:
        raise ValueError(f"not a benchmark run id: {run_or_thread_id!r}")
    return int(found.group(1))


__all__ = ["AGENT_NAME", "QUICK_SIZES", "SIZES", "LapSpec", "lap_spec", "laps_of", "ledger",
           "plan", "prose", "run_id", "tool_output"]
