"""Parallel tool calls: the wall time of a lap whose turn
asks for N slow calls, run one by one (``max_parallel_calls=1``) and together
(the default), in process on SQLite. Each call sleeps ``--seconds`` (an
IO-bound tool: a vendor that answers slowly) and lands an idempotent effect,
so the figure includes the ledger's intent and outcome writes.

    python -m bench.parallel --calls 5 --seconds 0.5 --repeat 3

Prints one JSON line per mode: median lap seconds, and the ratio to the
slowest call (1.0 would be a lap exactly as long as its slowest call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_worker.agent import Agent, Registry
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine.lap import run_lap
from agent_worker.inprocess import InProcessWorker
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


def _agent(calls: int, seconds: float, limit: int) -> Agent:
    @tool(kind="idempotent")
    def slow(n: int, ctx: ToolContext) -> dict[str, Any]:
        """An IO-bound call: waits for a slow vendor."""
        time.sleep(seconds)
        return {"n": n, "key": ctx.idempotency_key}

    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > 1:
            return turn("done")
        return turn("all", [("slow", {"n": i}) for i in range(calls)])

    return Agent(name="bench-parallel", model=ScriptedModel(script), tools=[slow],
                 max_parallel_calls=limit)


def measure(calls: int, seconds: float, limit: int, repeat: int) -> dict[str, Any]:
    """Median wall time of the first lap (the one with the calls) over ``repeat`` runs."""
    laps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        w = InProcessWorker(f"sqlite:///{Path(tmp) / 'bench.db'}")
        w.rt.registry = Registry()
        w.rt.registry.register(_agent(calls, seconds, limit))
        try:
            for _ in range(repeat):
                run = w.start_run("bench-parallel", "go")
                lap = w.queue.pending.popleft()
                started = time.perf_counter()
                run_lap(w.rt, lap.run_id, lap.lap)
                laps.append(time.perf_counter() - started)
                w.wait(run.id, timeout=60)
        finally:
            w.close()
    median = statistics.median(laps)
    return {"calls": calls, "call_seconds": seconds, "max_parallel_calls": limit,
            "lap_seconds_median": round(median, 3),
            "vs_slowest_call": round(median / seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for limit in (1, args.calls):
        print(json.dumps(measure(args.calls, args.seconds, limit, args.repeat)))


if __name__ == "__main__":
    main()
