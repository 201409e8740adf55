"""What lap tracing costs: the hooks the lap engine calls
when tracing is off (``AGENT_WORKER_TRACE_EXPORT`` empty), per lap, and a
whole in-process lap (SQLite, the ``loop`` agent) with tracing off and on
(spans written as JSON lines to a file).

    python -m bench.tracing_overhead --laps 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import tests.agents  # noqa: F401  (registers the "loop" agent)
from agent_worker import tracing
from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.messages import ToolCall
from agent_worker.inprocess import InProcessWorker


def hooks_ns(runs: int) -> float:
    """Nanoseconds per lap for the disabled hooks: the lap context, claimed,
    the model, one tool and the commit step, and end."""

    class Off:
        class settings:
            trace_export = ""

    rt: Any = Off()
    pc = PendingCall(call=ToolCall(id="c", name="step", arguments={}), lap=1, index=0)

    def lap() -> None:
        with tracing.lap_trace(rt, "r", 1) as tr:
            tracing.current().claimed(None)  # type: ignore[arg-type]
            with tracing.current().step("chat") as span:
                span.model_response(None)  # type: ignore[arg-type]
            with tracing.current().tool_step("r", pc) as span:
                span.tool_result(None)
            with tracing.current().step("commit"):
                pass
            tr.end("committed")

    return min(timeit.repeat(lap, number=runs, repeat=5)) / runs * 1e9


def lap_ms(laps: int, export: str, tmp: Path) -> float:
    w = InProcessWorker(f"sqlite:///{tmp / f'aw-{bool(export)}.db'}", trace_export=export)
    try:
        run = w.start_run("loop", {"laps": laps})
        t0 = time.perf_counter()
        w.run_until_idle()
        elapsed = time.perf_counter() - t0
        assert w.get_run(run.id).status == "succeeded"
        return elapsed / laps * 1e3
    finally:
        w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--laps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        off, on = [], []
        for i in range(args.repeats):  # interleaved, so load drifts hit both alike
            sub = tmp / str(i)
            sub.mkdir()
            off.append(lap_ms(args.laps, "", sub))
            on.append(lap_ms(args.laps, f"file:{sub / 'spans.jsonl'}", sub))
        print(json.dumps({
            "disabled_hooks_ns_per_lap": round(hooks_ns(20_000)),
            "lap_ms_tracing_off": round(statistics.median(off), 3),
            "lap_ms_tracing_on_file": round(statistics.median(on), 3),
            "laps": args.laps, "load": [round(x, 1) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
