"""The calls of one model turn, run concurrently where that cannot change what
happens (README, "Parallel tool calls").

The turn is cut into groups, in the model's order. A *barrier* call runs alone
in a group of its own: a tool declared ``parallel=False``, a durable sleep or
signal wait, and a call that needs a human's approval (so nothing after it runs
before the human decided, exactly as when calls ran one by one). The calls
between two barriers form one group and run together, at most
``max_parallel_calls`` at a time, each in a pool thread; the next group starts
when the whole group is done. Results are handed back in the model's order,
whatever order the calls finished in.

The threading model: a tool call is IO-bound (an HTTP request, a query), so
threads overlap them well; the lap's own thread waits for its group and then
commits. Each call keeps its own ledger row and key (``run:lap:call``) and
writes its intent and outcome in its own short transactions (the store's
engine hands each thread its own pooled connection; none is held while a tool
runs). The lease heartbeat runs on its own thread as before; each call checks
the lease before it starts, so a lost lease or a cancel stops calls not yet
started. A call's ``ToolError`` is its own result; an unexpected exception in
one call lets the others of its group finish (their outcomes land in the
ledger) and then fails the lap, whose replay reuses what landed and redoes
only what did not.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from agent_worker import tracing
from agent_worker.agent import Agent
from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.errors import LapInterrupted
from agent_worker.engine.calls import CallRunner, Done, Pause

Outcome = Done | Pause
#: A call, its outcome, and how long it took on its own (ms): in a group that
#: ran together, the lap's clock cannot tell one call's time from another's.
Ran = tuple[PendingCall, Outcome, float]


def is_barrier(agent: Agent, pc: PendingCall) -> bool:
    """Whether this call must run alone (see module docstring). An unknown tool
    is answered at once with an error, so it needs no barrier."""
    tool = agent.tool(pc.call.name)
    return tool is not None and (not tool.parallel or tool.control is not None
                                 or tool.requires_approval)


def groups(agent: Agent, calls: Sequence[PendingCall]) -> list[list[PendingCall]]:
    """The turn cut at its barriers, in the model's order."""
    out: list[list[PendingCall]] = []
    for pc in calls:
        if is_barrier(agent, pc):
            out.append([pc])
            out.append([])
        elif out:
            out[-1].append(pc)
        else:
            out.append([pc])
    return [g for g in out if g]


def outcomes(runner: CallRunner, calls: Sequence[PendingCall], *, limit: int,
             check: Callable[[], None]) -> Iterator[Ran]:
    """Each call with its outcome and duration, in the model's order. The
    consumer stops at the first ``Pause``; the groups after it never start."""
    for group in groups(runner.agent, calls):
        if len(group) == 1 or limit == 1:
            for pc in group:
                yield _timed(runner, pc, check)
            continue
        yield from _together(runner, group, limit, check)


def _timed(runner: CallRunner, pc: PendingCall, check: Callable[[], None]) -> Ran:
    check()
    started = time.perf_counter()
    with tracing.current().tool_step(runner.run_id, pc) as span:
        outcome = runner.run(pc)
        span.tool_result(None if isinstance(outcome, Pause) else outcome.message)
    return pc, outcome, round((time.perf_counter() - started) * 1e3, 2)


def _together(runner: CallRunner, group: list[PendingCall], limit: int,
              check: Callable[[], None]) -> list[Ran]:
    def one(pc: PendingCall) -> Ran:
        return _timed(runner, pc, check)

    pool = ThreadPoolExecutor(max_workers=min(limit, len(group)), thread_name_prefix="call")
    try:
        # Each call carries the lap's log context (run, lap) into its thread.
        futures: list[Future[Ran]] = [
            pool.submit(contextvars.copy_context().run, one, pc) for pc in group]
        wait(futures)
    finally:
        # Never wait here for a call still running: if this thread was
        # interrupted (a soft time limit), the lap must stop now.
        pool.shutdown(wait=False, cancel_futures=True)
    errors = [f.exception() for f in futures if f.exception() is not None]
    interrupted = [e for e in errors if isinstance(e, LapInterrupted)]
    if interrupted or errors:
        raise (interrupted or errors)[0]  # type: ignore[misc]
    return [f.result() for f in futures]


__all__ = ["groups", "is_barrier", "outcomes"]
