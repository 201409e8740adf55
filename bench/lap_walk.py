"""Which of our files one lap runs through: ``python -m bench.lap_walk``.

A reader taking the project over follows a lap from the worker's task entry
through the engine to the store's commit; every file on that walk is one more
to read before a change to the lap is safe. This runs one lap of a run whose
model asks for one tool call (so the ledger's intent and outcome are on the
walk) through the Celery task's function (``agent_worker.tasks.lap.run_lap``,
what a worker calls, with the deployed runtime and dispatcher) on a fresh
Postgres database, after a warm-up lap so import-time code is not counted, and
prints every file of ours whose functions ran, with their count.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from agent_worker.store.migrate import upgrade
from bench.common import ROOT, create_database, drop_database, sa_url

SHIPPED = ("agent_worker", "store", "tasks")


def _ours(filename: str) -> str | None:
    """The repository path of a source file of the shipped packages, else None."""
    path = Path(filename).resolve()
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts[0] in SHIPPED else None


@contextmanager
def walked() -> Iterator[set[str]]:
    """The shipped files whose functions are called meanwhile, in any thread."""
    files: set[str] = set()
    seen: dict[str, str | None] = {}

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call" and frame.f_code.co_name != "<module>":
            name = frame.f_code.co_filename
            if name not in seen:
                seen[name] = _ours(name)
            ours = seen[name]
            if ours is not None:
                files.add(ours)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield files
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def walk(database: str, broker: str) -> list[str]:
    """The files one tool-calling lap runs through (sorted)."""
    os.environ.update(AGENT_WORKER_DATABASE_URL=database, AGENT_WORKER_BROKER_URL=broker)
    # Imported after the environment is set: the settings and the Celery app
    # read it when first built.
    from agent_worker import Agent, ScriptedModel, register, tool, turn
    from agent_worker.api import AgentWorker
    from agent_worker.core.messages import ModelRequest, ModelResponse
    from agent_worker.tasks.lap import run_lap
    from agent_worker.tasks.runtime import runtime

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def script(request: ModelRequest) -> ModelResponse:
        return turn("", [("add", {"a": 1, "b": 2})]) if request.lap == 1 else turn("done")

    register(Agent(name="lap-walk", model=ScriptedModel(script), tools=[add]))
    aw = AgentWorker(runtime())
    warm, measured = aw.start_run("lap-walk", "go"), aw.start_run("lap-walk", "go")
    run_lap(run_id=warm.id, lap=1)
    with walked() as files:
        run_lap(run_id=measured.id, lap=1)
    assert aw.get_run(measured.id).lap == 1, "the measured lap did not commit"
    return sorted(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:63799/13",
                        help="a Redis database the lap may send its next lap to "
                             "(flushed afterwards)")
    args = parser.parse_args()
    name = "bench_lap_walk"
    url = create_database(name)
    try:
        upgrade(sa_url(url))
        files = walk(url, args.broker)
    finally:
        drop_database(name)
        import redis  # only to empty the broker database the walk sent to

        redis.Redis.from_url(args.broker).flushdb()
    for f in files:
        print(f)
    print(f"{len(files)} files")


if __name__ == "__main__":
    main()
