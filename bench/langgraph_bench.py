"""LangGraph on the shared workload: a StateGraph whose one node runs a lap
(scripted model turn plus the ``read`` tool), looping ``n`` times, with the
messages channel and ``PostgresSaver`` at durability "sync" (each step's
checkpoint is written before the next step starts), against the same
Postgres server.

Two variants of the messages channel: ``add_messages`` (the default reducer
channel: each checkpoint stores the whole list) and the beta ``DeltaChannel``
(stores writes and replays them; snapshots every 100 updates).

One node per lap means one checkpoint per lap, as agent-worker commits one per
lap; the idiomatic agent/tools two-node graph would write two.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import version
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from bench.common import log, repeat_ms, summary
from bench.workload import USAGE, lap_spec, ledger, plan, run_id, tool_output

OWNERS = {"checkpoints": "thread_id", "checkpoint_blobs": "thread_id",
          "checkpoint_writes": "thread_id"}
VARIANTS = ("langgraph", "langgraph-delta")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    lap: int
    n: int
    plan: list[dict[str, Any]]
    budget: dict[str, Any]


try:  # beta, langgraph >= 1.2
    from langgraph.channels.delta import DeltaChannel
    from langgraph.graph.message import _messages_delta_reducer
except ImportError:  # pragma: no cover - older langgraph: the variant reports an error
    DeltaChannel = None  # type: ignore[assignment,misc]

if DeltaChannel is not None:
    class DeltaState(TypedDict):
        messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]
        lap: int
        n: int
        plan: list[dict[str, Any]]
        budget: dict[str, Any]


def _delta_state() -> type:
    if DeltaChannel is None:
        raise ImportError("this langgraph has no DeltaChannel (beta, langgraph >= 1.2)")
    return DeltaState


def read(path: str) -> str:
    """The tool: does nothing, returns fixed text."""
    return tool_output(path)


def step(state: Any) -> dict[str, Any]:
    """One lap: the scripted model's turn, then its tool call, then the state update."""
    lap = state["lap"] + 1
    spec = lap_spec(lap, state["n"])
    meta = {"usage_metadata": {"input_tokens": USAGE[0], "output_tokens": USAGE[1],
                               "total_tokens": sum(USAGE)},
            "response_metadata": {"model_name": "scripted"}}
    if spec.call_args is None:
        new: list[AnyMessage] = [AIMessage(content=spec.text, id=f"m{lap}a", **meta)]
    else:
        call = {"name": "read", "args": spec.call_args, "id": "call_0", "type": "tool_call"}
        new = [AIMessage(content=spec.text, tool_calls=[call], id=f"m{lap}a", **meta),
               ToolMessage(content=read(**spec.call_args), tool_call_id="call_0", name="read",
                           id=f"m{lap}t")]
    return {"messages": new, "lap": lap, "plan": plan(lap), "budget": ledger(lap)}


def _route(state: Any) -> str:
    return END if state["lap"] >= state["n"] else "step"


def build(saver: PostgresSaver, variant: str) -> Any:
    graph: StateGraph[Any] = StateGraph(_delta_state() if variant == "langgraph-delta" else State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _route, ["step", END])
    return graph.compile(checkpointer=saver)


@contextmanager
def saver(url: str) -> Iterator[PostgresSaver]:
    with PostgresSaver.from_conn_string(url) as s:
        yield s


def setup(url: str) -> None:
    with saver(url) as s:
        s.setup()


def invoke(graph: Any, tid: str, n: int) -> float:
    """One whole run; seconds. Fails unless it ran exactly ``n`` laps."""
    config = {"configurable": {"thread_id": tid}, "recursion_limit": n + 10}
    start = {"messages": [HumanMessage(content=json.dumps({"task": "work through the plan"}),
                                       id="m0")],
             "lap": 0, "n": n, "plan": plan(0), "budget": ledger(0)}
    t0 = time.perf_counter()
    out = graph.invoke(start, config, durability="sync")
    elapsed = time.perf_counter() - t0
    if out["lap"] != n or len(out["messages"]) != 2 * n:
        raise RuntimeError(f"{tid}: ran {out['lap']} laps, {len(out['messages'])} messages")
    return elapsed


class Graph:
    """The LangGraph graph on ``PostgresSaver``, as a ``System``."""

    owners: Mapping[str, str] = OWNERS

    def __init__(self, url: str, variant: str) -> None:
        self.url, self.variant = url, variant
        self.name = variant.replace("-", "_")
        self._saver = saver(url)
        s = self._saver.__enter__()
        try:
            s.setup()
            self.graph = build(s, variant)
            self.run(run_id("warm", 5, 0), 5)
        except BaseException:
            self.close()
            raise

    def run(self, rid: str, n: int) -> float:
        return invoke(self.graph, rid, n)

    def close(self) -> None:
        self._saver.__exit__(None, None, None)


def bench_load(url: str, variant: str, run_ids: dict[int, str], samples: int,
               ) -> dict[str, Any]:
    """Cost of loading the latest checkpoint of a finished ``n``-step thread:
    ``checkpointer.get_tuple`` (what a resume reads) and ``graph.get_state``."""
    out: dict[str, Any] = {}
    with saver(url) as s:
        graph = build(s, variant)
        for n, tid in run_ids.items():
            config = {"configurable": {"thread_id": tid}}

            def get_tuple(config: dict[str, Any] = config, n: int = n) -> None:
                got = s.get_tuple(config)  # type: ignore[arg-type]
                if got is None:
                    raise RuntimeError(f"no checkpoint for {config}")

            def get_state(config: dict[str, Any] = config, n: int = n) -> None:
                snap = graph.get_state(config)
                if len(snap.values["messages"]) != 2 * n:
                    raise RuntimeError(f"state of {config} has the wrong length")

            out[str(n)] = {"get_tuple_ms": repeat_ms(get_tuple, samples),
                           "get_state_ms": repeat_ms(get_state, samples)}
            log(f"{variant} load at step {n}: get_tuple "
                f"{out[str(n)]['get_tuple_ms']['median']:.2f} ms, get_state "
                f"{out[str(n)]['get_state_ms']['median']:.2f} ms")
    return out


_graph: Any = None
_saver_cm: Any = None


def _init_child(url: str, variant: str) -> None:
    global _graph, _saver_cm
    _saver_cm = saver(url)
    _graph = build(_saver_cm.__enter__(), variant)


def _child_run(args: tuple[str, int]) -> tuple[float, float]:
    tid, n = args
    start = time.time()
    invoke(_graph, tid, n)
    return start, time.time()


def bench_throughput(url: str, variant: str, processes: tuple[int, ...], runs_n: int,
                     laps: int, repeats: int, prefix: str) -> dict[str, Any]:
    """Laps per second over ``runs_n`` runs of ``laps`` laps, run to completion
    one at a time by each of ``k`` processes (LangGraph has no worker fleet of
    its own; this is the plain way to spread threads over processes)."""
    out: dict[str, Any] = {}
    ctx = multiprocessing.get_context("spawn")
    for k in processes:
        rates = []
        with ctx.Pool(k, initializer=_init_child, initargs=(url, variant)) as pool:
            pool.map(_child_run, [(run_id(f"{prefix}w{k}", 3, i), 3) for i in range(k)])
            for rep in range(repeats):
                jobs = [(run_id(f"{prefix}k{k}r{rep}", laps, i), laps) for i in range(runs_n)]
                spans = pool.map(_child_run, jobs, chunksize=1)
                seconds = max(e for _, e in spans) - min(s for s, _ in spans)
                rates.append(runs_n * laps / seconds)
        out[str(k)] = {"laps_per_s": summary(rates)}
        log(f"{variant} throughput {k} proc: {summary(rates)['median']:.0f} laps/s")
    return out


def versions() -> dict[str, str]:
    return {p: version(p) for p in ("langgraph", "langgraph-checkpoint",
                                    "langgraph-checkpoint-postgres", "langchain-core")}
