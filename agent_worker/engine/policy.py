"""A tool's call policy: how long one attempt may take, and when to try again.

``@tool(timeout=..., retries=..., backoff=...)`` is applied here, around the one
place a tool's function is called (``engine.calls``). What each outcome means:

- ``RetryableToolError`` (the tool's own word that this attempt applied
  nothing) is retried up to ``retries`` times, waiting ``backoff * 2**n``
  seconds, with the same arguments and the same idempotency key; then it is a
  tool error like any other. Retries happen inside the call, so the ledger row
  stays ``pending`` through them: a worker killed between two attempts leaves a
  pending effect that the replay settles by the ledger's rules.
- A timeout raises ``ToolTimeoutError``. It is retried only when calling again
  cannot make the effect land twice: reads, and idempotent tools (same key).
  Anything else is left to the caller (``engine.calls``), which settles it by
  the ledger's rules.

Python cannot stop a thread: a timed-out attempt keeps running in its daemon
thread until the function returns, and its late answer is dropped. A tool that
may hang should pass its own timeout to its client too; the engine's bounds how
long the lap waits, not what the tool is doing.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel

from agent_worker.core.errors import RetryableToolError, ToolTimeoutError
from agent_worker.tools import Tool, ToolContext

Sleep = Callable[[float], None]


def invoke(tool: Tool, args: BaseModel, ctx: ToolContext, *, check: Callable[[], None],
           sleep: Sleep = time.sleep) -> Any:
    """Call ``tool`` under its policy; ``check`` runs before each retry and
    raises if the lap must stop (lease lost, run cancelled)."""
    attempt = 0
    while True:
        try:
            return _bounded(tool, args, ctx)
        except RetryableToolError:
            if attempt >= tool.retries:
                raise
        except ToolTimeoutError:
            if attempt >= tool.retries or not repeatable(tool):
                raise
        sleep(tool.backoff * 2 ** attempt)
        attempt += 1
        check()


def repeatable(tool: Tool) -> bool:
    """Whether calling again after a timeout cannot apply the effect twice."""
    return tool.kind in ("read", "idempotent")


def _bounded(tool: Tool, args: BaseModel, ctx: ToolContext) -> Any:
    if tool.timeout is None:
        return tool.invoke(args, ctx)
    done: Future[Any] = Future()

    def attempt() -> None:
        try:
            done.set_result(tool.invoke(args, ctx))
        except BaseException as e:  # handed to the waiting lap thread, raised there
            done.set_exception(e)

    # The lap's log context (run, lap) follows the call into its thread.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(attempt,), daemon=True,
                     name=f"tool:{tool.name}").start()
    finished = threading.Event()
    done.add_done_callback(lambda _: finished.set())
    if not finished.wait(tool.timeout):
        raise ToolTimeoutError(f"{tool.name} did not finish within {tool.timeout:g}s")
    return done.result()


__all__ = ["invoke", "repeatable"]
