"""The built-in control tools of a lap's calls (``engine.calls``), answered by
the engine itself, never through the effect ledger: a sleep and a wait for a
signal pause the run (their wake time rides in the pending call, so a replay
waits for the same moment), and a state tool writes the lap's draft.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from agent_worker.core.checkpoint import PendingCall
from agent_worker.core.errors import InvalidInputError
from agent_worker.core.runstate import StateDraft
from agent_worker.core.untrusted import check_name
from agent_worker.core.vocabulary import WaitingFor
from agent_worker.engine.callresult import Done, Pause, result
from agent_worker.runtime import Runtime
from agent_worker.tools import Tool


def write_state(state: StateDraft | None, pc: PendingCall, tool: Tool, args: BaseModel) -> Done:
    """A built-in state tool (``agent_worker.state_toolkit``): written to the
    lap's draft, stored by the lap's commit; a refused write (over a bound)
    goes back to the model as a tool error."""
    if state is None:
        return result(pc, f"{tool.name} is not available here", error=True)
    a = args.model_dump()
    try:
        if tool.name == "set_plan":
            state.set_plan(a["steps"])
        elif tool.name == "mark_step":
            state.mark_step(a["step"], a["done"])
        elif tool.name == "set_next_action":
            state.set_next_action(a["action"])
        elif tool.name == "pin_fact":
            state.pin_fact(a["key"], a["value"])
        else:
            return result(pc, f"{tool.name} is not a built-in state tool", error=True)
    except InvalidInputError as e:
        return result(pc, f"{tool.name} refused: {e}", error=True)
    return result(pc, "ok")


def sleep(rt: Runtime, pc: PendingCall, args: BaseModel) -> Done | Pause:
    """``sleep_tool``: pause until ``seconds`` from the first attempt (or
    ``until``), then answer with when the run slept and woke."""
    now = rt.clock.now()
    if pc.wake_at is None:
        seconds, until = getattr(args, "seconds", None), getattr(args, "until", None)
        if until is not None and until.tzinfo is None:
            return result(pc, "`until` needs a timezone (e.g. 2026-12-01T09:00:00Z)",
                          error=True)
        wake = until if until is not None else now + timedelta(seconds=seconds or 0)
        paused = pc.model_copy(update={"wake_at": wake, "paused_at": now})
        return Pause("sleeping", None, wake, paused)
    if now < pc.wake_at:
        return Pause("sleeping", None, pc.wake_at, pc)
    return result(pc, f"Slept from {pc.paused_at:%Y-%m-%d %H:%M:%S} UTC; woke at "
                      f"{now:%Y-%m-%d %H:%M:%S} UTC.")


def wait_for_signal(rt: Runtime, run_id: str, taken: set[int], pc: PendingCall,
                    args: BaseModel) -> Done | Pause:
    """``wait_for_signal_tool``: the oldest pending signal ``name`` no earlier
    call of this lap took (``taken``, marked delivered by the lap's commit),
    else pause until one arrives or the timeout passes."""
    name = str(args.model_dump()["name"])
    try:
        check_name(name, "signal name", max_chars=rt.settings.max_signal_name_chars)
    except InvalidInputError as e:
        return result(pc, str(e), error=True)
    now = rt.clock.now()
    pending = [s for s in rt.store.pending_signals(run_id, name)
               if s.id not in taken]
    if pending:
        s = pending[0]
        taken.add(s.id)
        done = result(pc, {"signal": name, "received_at": s.created_at.isoformat(),
                           "payload": s.payload})
        return Done(done.message, signal_id=s.id)
    if pc.paused_at is None:
        timeout = getattr(args, "timeout_seconds", None)
        wake = now + timedelta(seconds=timeout) if timeout is not None else None
        pc = pc.model_copy(update={"wake_at": wake, "paused_at": now})
    elif pc.wake_at is not None and now >= pc.wake_at:
        return result(pc, f"No signal {name!r} arrived between "
                          f"{pc.paused_at:%Y-%m-%d %H:%M:%S} and {now:%Y-%m-%d %H:%M:%S} "
                          "UTC (timed out).", error=True)
    return Pause("waiting", WaitingFor.signal(name), pc.wake_at, pc)


__all__ = ["sleep", "wait_for_signal", "write_state"]
