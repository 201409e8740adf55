"""Agents for the child-run tests, importable by real workers.

``fan`` asks its one tool, ``spawn``, to start ``n`` ``kid`` runs and wait for
them; then it answers with the tool's result, so a test reads what the model
was told from the parent's result. A kid answers ``{"double": 2n}``, fails when
told to, or (``hold``) reserves an item and waits for a signal, so it is still
going when its parent is cancelled.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.children import Child, StartChildren
from agent_worker.control import wait_for_signal_tool
from agent_worker.core.errors import ModelRefusalError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool

#: (tool, key) of every call this process made: tests count replays with it.
CALLS: list[tuple[str, str]] = []


@tool(kind="idempotent")
def spawn(n: int, ctx: ToolContext, wait: str = "all", fail_at: int = -1,
          hold: bool = False, hold_at: int = -1, sleep: float = 0.0) -> StartChildren:
    """Start ``n`` kids and wait for them."""
    CALLS.append(("spawn", ctx.idempotency_key))
    _journal("spawn", ctx.idempotency_key)
    kids = [Child(agent="kid", input={"n": i, "fail": i == fail_at, "hold": hold or i == hold_at,
                                      "sleep": sleep}) for i in range(n)]
    return ctx.start_children(kids, wait="any" if wait == "any" else "all")


@tool(kind="compensatable")
def reserve(item: str, ctx: ToolContext) -> dict[str, str]:
    """Hold stock; undone by releasing it."""
    CALLS.append(("reserve", ctx.idempotency_key))
    return {"reserved": item}


@reserve.compensator
def _release(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, str]:
    CALLS.append(("release", ctx.idempotency_key))
    _journal("release", ctx.idempotency_key)
    return {"released": args["item"]}


def _journal(what: str, key: str) -> None:
    """Real workers are other processes: they note compensations in a file the
    test names (``CHILD_TEST_JOURNAL``)."""
    path = os.environ.get("CHILD_TEST_JOURNAL")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {key}\n")


def _fan(r: ModelRequest) -> ModelResponse:
    last = r.messages[-1]
    if last.role == "tool":
        return turn(last.content)
    first = next(m for m in r.messages if m.role == "user")
    return turn("spawning", [("spawn", json.loads(first.content))])


def _kid(r: ModelRequest) -> ModelResponse:
    first = next(m for m in r.messages if m.role == "user")
    args = json.loads(first.content)
    if args.get("fail"):
        raise ModelRefusalError(f"kid {args['n']} refuses")
    if args.get("sleep"):
        time.sleep(float(args["sleep"]))
    if args.get("hold"):
        done = [m for m in r.messages if m.role == "tool"]
        if len(done) == 0:
            return turn("holding", [("reserve", {"item": f"item-{args['n']}"})])
        if len(done) == 1:
            return turn("waiting", [("wait_for_signal", {"name": "go"})])
    return turn(json.dumps({"double": 2 * int(args["n"])}))


register(Agent(name="fan", model=lambda: ScriptedModel(_fan), tools=[spawn],
               window_messages=2000))
register(Agent(name="kid", model=lambda: ScriptedModel(_kid),
               tools=[reserve, wait_for_signal_tool, spawn], window_messages=2000))
