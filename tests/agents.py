"""Agents the tests run, registered in every worker process through
``AGENT_WORKER_AGENT_MODULES``. Each reads its parameters from the run input
(the first user message), so any process scripts the same answers."""

from __future__ import annotations

import json
import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_worker.agent import Agent, register
from agent_worker.control import sleep_tool, wait_for_signal_tool
from agent_worker.core.budget import Budget
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.demo.vendor import VendorClient
from agent_worker.model.scripted import ScriptedModel, turn
from agent_worker.tools import ToolContext, tool


def params(request: ModelRequest) -> dict[str, Any]:
    first = next(m for m in request.messages if m.role == "user")
    value: dict[str, Any] = json.loads(first.content or "{}")
    return value


@tool
def step(n: int, pause: float = 0.0) -> dict[str, int]:
    """A read step; ``pause`` makes the lap slow enough to kill mid-way."""
    if pause:
        time.sleep(pause)
    return {"step": n}


def _loop(r: ModelRequest) -> ModelResponse:
    p = params(r)
    if r.lap >= int(p.get("laps", 30)):
        return turn(json.dumps({"laps": r.lap}))
    return turn(f"lap {r.lap}", [("step", {"n": r.lap, "pause": float(p.get("pause", 0))})])


register(Agent(name="loop", model=lambda: ScriptedModel(_loop), tools=[step],
               window_messages=2000, budget=Budget(max_laps=1000)))


def _vendor() -> VendorClient:
    return VendorClient(os.environ["AGENT_WORKER_VENDOR_URL"])


@tool(kind="idempotent")
def pay(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund through the vendor, passing the idempotency key."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@tool(kind="compensatable")
def book(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A saga step: a payment that can be undone."""
    if amount_cents < 0:
        from agent_worker.core.errors import ToolError

        raise ToolError("negative amount")
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@book.compensator
def _unbook(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
    with _vendor() as v:
        return v.notice(f"undo-{args['order_id']}@vendor.test", "compensated",
                        idempotency_key=ctx.idempotency_key)


def _payments(r: ModelRequest) -> ModelResponse:
    p = params(r)
    n = int(p.get("payments", 3))
    tool_name = p.get("tool", "pay")
    if r.lap > n:
        return turn(json.dumps({"paid": n}))
    amount = int(p.get("amount", 1000))
    if p.get("fail_at") == r.lap:
        amount = -1
    return turn(f"payment {r.lap}", [(tool_name, {"order_id": f"o{r.lap}",
                                                  "amount_cents": amount})])


register(Agent(name="payments", model=lambda: ScriptedModel(_payments), tools=[pay, book],
               window_messages=2000))


def _flaky(r: ModelRequest) -> ModelResponse:
    """Answers differently every call: only the journal keeps replays consistent."""
    p = params(r)
    if r.lap > int(p.get("laps", 3)):
        return turn("done")
    return turn("", [("pay", {"order_id": f"o{r.lap}-{random.randrange(10**9)}",
                              "amount_cents": 100})])


register(Agent(name="flaky-model", model=lambda: ScriptedModel(_flaky), tools=[pay],
               window_messages=2000))


@tool
def explode() -> None:
    """Always fails, like a poison lap."""
    raise RuntimeError("boom: this tool always fails")


register(Agent(name="poison", tools=[explode], window_messages=100,
               model=lambda: ScriptedModel(lambda r: turn("", [("explode", {})]))))


@tool(kind="irreversible")
def wire_money(account: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Irreversible: needs a human every time."""
    with _vendor() as v:
        return v.refund(account, amount_cents, idempotency_key=ctx.idempotency_key)


def _pauses(r: ModelRequest) -> ModelResponse:
    p = params(r)
    plan: list[list[Any]] = p.get("plan", [])
    if r.lap > len(plan):
        return turn(json.dumps({"laps": r.lap}))
    name, args = plan[r.lap - 1]
    return turn(f"step {r.lap}", [(name, args)])


register(Agent(name="pauses", model=lambda: ScriptedModel(_pauses),
               tools=[wire_money, sleep_tool, wait_for_signal_tool, step, book],
               window_messages=2000, approval_owner="ops"))


# --- effects declared honestly, and a saga whose third step fails ----------------------


def _undo_notice(ctx: ToolContext, what: str, order_id: str) -> dict[str, Any]:
    """An undo is itself an effect: it carries its own (``:undo``) key to the vendor."""
    with _vendor() as v:
        return v.notice(f"undo-{order_id}@vendor.test", f"{what} {order_id} reversed",
                        idempotency_key=ctx.idempotency_key)


@tool(kind="compensatable")
def charge(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A payment declared for what it is: the vendor may ignore idempotency keys and
    this tool cannot ask it what happened, so a blind re-call could pay twice. It can
    be undone, though (a reversal notice)."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@charge.compensator
def _uncharge(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
    return _undo_notice(ctx, "charge", args["order_id"])


@tool(kind="compensatable")
def charge_checked(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """Like ``charge``, but the vendor can be asked by key whether the payment landed."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@charge_checked.compensator
def _uncharge_checked(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
    return _undo_notice(ctx, "charge", args["order_id"])


@charge_checked.lookup
def _find_charge(key: str) -> dict[str, Any] | None:
    """What the vendor recorded under ``key``: adopted as the call's result."""
    with _vendor() as v:
        found = v.lookup(key)
    if found is None or int(found["status"]) >= 400:
        return None
    response: dict[str, Any] = found["response"]
    return response


register(Agent(name="charges", model=lambda: ScriptedModel(_payments),
               tools=[charge, charge_checked], window_messages=2000))


@tool(kind="compensatable")
def reserve(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
    """A second saga step (another name, so a fault can be scoped to one undo)."""
    with _vendor() as v:
        return v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)


@reserve.compensator
def _unreserve(args: dict[str, Any], result: Any, ctx: ToolContext) -> dict[str, Any]:
    return _undo_notice(ctx, "reservation", args["order_id"])


# Scripted by ``plan`` like ``pauses``: e.g. charge, reserve, then ``explode``, which
# raises a non-ToolError every time, so the lap retries and the run fails (saga).
register(Agent(name="saga", model=lambda: ScriptedModel(_pauses),
               tools=[charge, reserve, explode], window_messages=2000))


# --- chaos and fault tests (tests/chaos) ------------------------------------------


@tool
def needs_marker(marker: str) -> dict[str, str]:
    """Fails (a plain exception, so the lap is retried, then dead-lettered) until
    an operator creates ``marker``: a poison lap that a fix can cure."""
    if not os.path.exists(marker):
        raise RuntimeError(f"fragile: {marker} does not exist yet")
    return {"marker": marker}


@tool
def hang(marker: str, seconds: float, always: bool = False) -> dict[str, bool]:
    """Hangs for ``seconds`` (a stuck vendor call); unless ``always``, only on the
    first attempt, which leaves ``marker`` behind so the retry goes through."""
    if always or not os.path.exists(marker):
        with open(marker, "a"):
            pass
        time.sleep(seconds)
    return {"hung": False}


def _fragile(r: ModelRequest) -> ModelResponse:
    """Read steps, with ``needs_marker`` / ``hang`` at lap ``at`` (``tool``)."""
    p = params(r)
    if r.lap > int(p.get("laps", 3)):
        return turn(json.dumps({"laps": r.lap - 1}))
    if r.lap == int(p.get("at", 2)):
        if p.get("tool", "needs_marker") == "hang":
            return turn("hang", [("hang", {"marker": p["marker"],
                                           "seconds": float(p.get("seconds", 60)),
                                           "always": bool(p.get("always", False))})])
        return turn("fragile", [("needs_marker", {"marker": p["marker"]})])
    return turn(f"lap {r.lap}", [("step", {"n": r.lap})])


register(Agent(name="fragile", model=lambda: ScriptedModel(_fragile),
               tools=[step, needs_marker, hang], window_messages=200))


def _chaos_mix(r: ModelRequest) -> ModelResponse:
    """Odd laps read (``step``, sleeping ``pause`` seconds), even laps pay through
    the vendor (idempotent ``pay``, order ``<tag>-<lap>``): what the chaos suite
    counts at the vendor."""
    p = params(r)
    if r.lap > int(p.get("laps", 30)):
        return turn(json.dumps({"laps": r.lap - 1}))
    if r.lap % 2:
        return turn(f"read {r.lap}", [("step", {"n": r.lap,
                                                "pause": float(p.get("pause", 0))})])
    return turn(f"pay {r.lap}", [("pay", {"order_id": f"{p['tag']}-{r.lap}",
                                          "amount_cents": int(p.get("amount", 100))})])


register(Agent(name="chaos-mix", model=lambda: ScriptedModel(_chaos_mix), tools=[step, pay],
               window_messages=2000, budget=Budget(max_laps=1000)))


# --- pauses through real workers --------------------------------------------------


class OffsetClock:
    """Wall-clock time plus an offset kept in a file: a clock a test can move
    forward for every process of a fleet at once (workers, the sweeper, the API),
    so timers and timeouts fire without the test sleeping through them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def offset(self) -> timedelta:
        try:
            with open(self.path) as f:
                return timedelta(seconds=float(f.read() or 0))
        except FileNotFoundError:
            return timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset()

    def advance(self, **delta: float) -> datetime:
        moved = self.offset() + timedelta(**delta)
        with open(self.path + ".tmp", "w") as f:
            f.write(str(moved.total_seconds()))
        os.replace(self.path + ".tmp", self.path)
        return self.now()


if os.environ.get("AGENT_WORKER_TEST_CLOCK_FILE"):
    # A worker started with a test clock reads time from it (leases included).
    from agent_worker.core.clock import SystemClock

    _fleet_clock = OffsetClock(os.environ["AGENT_WORKER_TEST_CLOCK_FILE"])
    SystemClock.now = lambda self: _fleet_clock.now()  # type: ignore[method-assign]


# ``loop`` with a price for the scripted model, so a run has a cost to budget:
# each lap costs 100 * 1 + 20 * 2 = 140 micro-units.
register(Agent(name="priced-loop", model=lambda: ScriptedModel(_loop), tools=[step],
               window_messages=2000, budget=Budget(max_laps=1000),
               prices={"scripted": {"input_per_mtok": "1", "output_per_mtok": "2"}}))


def _llm_url() -> str:
    return os.environ["AGENT_WORKER_TEST_LLM_URL"]


def _openai() -> Any:
    from agent_worker.model.openai_client import OpenAIChatModel

    return OpenAIChatModel("gpt-4o-mini", base_url=_llm_url() + "/v1", max_retries=3)


def _anthropic() -> Any:
    from agent_worker.model.anthropic_client import AnthropicModel

    return AnthropicModel("claude-haiku-4-5", base_url=_llm_url(), max_retries=3)


# Real provider clients against the loopback fake server (tests/integration/test_providers.py).
register(Agent(name="openai-agent", model=_openai, tools=[step], window_messages=200))
register(Agent(name="anthropic-agent", model=_anthropic, tools=[step], window_messages=200))


# --- hostile payloads through real workers -----------------------------------------


@tool(kind="idempotent")
def pay_noisy(order_id: str, amount_cents: int, ctx: ToolContext) -> str:
    """Pays, then answers like a binary-ish vendor: U+0000 and a lone surrogate
    in the text (Postgres can hold neither)."""
    with _vendor() as v:
        paid = v.refund(order_id, amount_cents, idempotency_key=ctx.idempotency_key)
    return f"refund {paid['id']}\x00 of {amount_cents} \udc80ok"


def _noisy(r: ModelRequest) -> ModelResponse:
    n = int(params(r).get("payments", 2))
    if r.lap > n:
        return turn(json.dumps({"paid": n}))
    return turn(f"payment {r.lap}\x00", [("pay_noisy", {"order_id": f"o{r.lap}\x00",
                                                       "amount_cents": 1000})])


register(Agent(name="noisy-payments", model=lambda: ScriptedModel(_noisy), tools=[pay_noisy],
               window_messages=2000))
# ``rolling`` at two versions for the rolling-deploy test: a worker started with
# AGENT_WORKER_TEST_ROLLING=1 or =2 knows only that version (old and new code);
# any other process knows both. Each model turn says which version made it.
def _rolling_model(version: str) -> Any:
    def script(r: ModelRequest) -> ModelResponse:
        p = params(r)
        if r.lap >= int(p.get("laps", 20)):
            return turn(f"v{version} done")
        return turn(f"v{version} lap {r.lap}",
                    [("step", {"n": r.lap, "pause": float(p.get("pause", 0))})])

    return lambda: ScriptedModel(script)


def _rolling_migrate(ckpt: Any, from_version: str) -> Any:
    return ckpt.model_copy(update={"facts": {**ckpt.facts, "migrated_from": from_version}})


_ROLLING = os.environ.get("AGENT_WORKER_TEST_ROLLING", "")
if _ROLLING in ("", "1"):
    register(Agent(name="rolling", version="1", model=_rolling_model("1"), tools=[step],
                   window_messages=2000))
if _ROLLING in ("", "2"):
    register(Agent(name="rolling", version="2", model=_rolling_model("2"), tools=[step],
                   window_messages=2000, resumes=("1",), migrate=_rolling_migrate))


# --- a run that writes its own plan and facts ---------------------------------


def _planner(r: ModelRequest) -> ModelResponse:
    """Lap 1 sets a plan of ``laps - 2`` steps and pins a fact; lap k marks step
    k - 1 done, pins another fact and appends k to the ``trail`` fact (through
    a slow read step, on every lap or only on ``slow_laps``, so a lap is in
    flight long enough for an operator to race it or a test to kill it); the
    last lap answers."""
    if r.lap == 1:
        p = params(r)
        laps = int(p.get("laps", 10))
        return turn("planning", [("set_plan", {"steps": [f"s{i}" for i in range(1, laps - 1)]}),
                                 ("pin_fact", {"key": "goal", "value": p.get("goal", "x")}),
                                 ("pin_fact", {"key": "params", "value": p})])
    # The input left the window long ago: read it back from the pinned facts,
    # which every lap's system context carries.
    facts = json.loads(r.instructions.split("Pinned facts:\n", 1)[1].split("\n\n", 1)[0])
    p = facts["params"]
    laps = int(p.get("laps", 10))
    if r.lap >= laps:
        return turn(json.dumps({"laps": r.lap}))
    # ``trail`` grows by this lap's number on top of the state the lap started
    # from: a lost lap leaves a gap in it, a lap applied twice a repeat.
    slow = r.lap in p.get("slow_laps", [r.lap])
    return turn(f"lap {r.lap}", [
        ("mark_step", {"step": r.lap - 1}),
        ("pin_fact", {"key": f"lap_{r.lap}", "value": r.lap}),
        ("pin_fact", {"key": "trail", "value": [*facts.get("trail", []), r.lap]}),
        ("step", {"n": r.lap, "pause": float(p.get("pause", 0)) if slow else 0.0})])


def _register_planner() -> None:
    from agent_worker.state_toolkit import state_tools
    register(Agent(name="planner", model=lambda: ScriptedModel(_planner),
                   tools=[*state_tools, step], window_messages=6, compact_after=3))


_register_planner()
