"""DBOS Transact on the shared workload: a workflow of ``n`` steps, one step per
lap, each step making the lap's scripted model turn and tool result and
returning them with the lap's state, which DBOS checkpoints (its default
serializer) in its system database before the next step starts.

DBOS keeps no message history of its own: a step's output is its record,
so this is the same "one durable record per lap" shape as agent-worker's lap
commit and LangGraph's one-node-per-lap graph. Its system database is a
database of its own on the shared server, so its storage is measured alone.

DBOS is a process-wide singleton (one ``DBOS`` per process), so one
``Workflow`` at a time; the benchmark measures it in the overhead phase only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID

from bench.common import libpq_url, sa_url
from bench.floor import lap_row
from bench.workload import run_id

SCHEMA = "dbos"
TABLES = ("workflow_status", "operation_outputs", "workflow_input", "workflow_output")
"""The system tables a workflow writes to (all keyed by ``workflow_uuid``);
those this DBOS version does not create are left out at start."""


def _lap(lap: int, n: int) -> dict[str, Any]:
    """Lap ``lap``: the model turn, its tool result and the new state (the same
    content ``bench.floor`` inserts as one row)."""
    out: dict[str, Any] = json.loads(lap_row(lap, n))
    return out


# Registered by call rather than as decorators: where the [bench] extra is not
# installed (CI's type check), DBOS is Any and a decorator would untype them.
lap_step = DBOS.step(name="lap")(_lap)


def _agent_run(n: int) -> int:
    """A run of ``n`` laps, one durable step each; the messages are carried in
    the workflow's memory (a recovery replays the steps' recorded outputs)."""
    messages: list[dict[str, Any]] = []
    for lap in range(1, n + 1):
        messages += lap_step(lap, n)["messages"]
    return len(messages)


agent_run = DBOS.workflow(name="agent_run")(_agent_run)


class Workflow:
    """DBOS steps on their own system database, as a ``System``."""

    name = "dbos"

    def __init__(self, url: str) -> None:
        self.url = url
        config: DBOSConfig = {"name": "agent-worker-bench", "system_database_url": sa_url(url),
                              "log_level": "WARNING"}
        DBOS(config=config)
        try:
            DBOS.launch()
            with psycopg.connect(libpq_url(url)) as conn:
                have = {r[0] for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (SCHEMA,))}
            self.owners: Mapping[str, str] = {f"{SCHEMA}.{t}": "workflow_uuid"
                                              for t in TABLES if t in have}
            self.run(run_id("warm", 5, 0), 5)
        except BaseException:
            self.close()
            raise

    def run(self, rid: str, n: int) -> float:
        """One whole workflow; seconds. Fails unless every lap was a step."""
        t0 = time.perf_counter()
        with SetWorkflowID(rid):
            got = agent_run(n)
        elapsed = time.perf_counter() - t0
        expected = 2 * n - 1  # the last lap answers without a tool call
        if got != expected:
            raise RuntimeError(f"{rid}: {got} messages, expected {expected}")
        return elapsed

    def close(self) -> None:
        DBOS.destroy(destroy_registry=False)
