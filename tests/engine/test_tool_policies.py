"""Per-tool policies (engine.policy, engine.progress): timeouts, retries with
backoff, and heartbeats with progress, in process on SQLite and Postgres."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from agent_worker import InProcessWorker, ScriptedModel, api, tool, turn
from agent_worker.agent import Agent
from agent_worker.cli import app as cli_app
from agent_worker.core.constants import effect_key
from agent_worker.core.errors import AgentDefinitionError, RetryableToolError, ToolTimeoutError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.engine import policy
from agent_worker.engine.progress import latest
from agent_worker.tools import Tool, ToolContext, ToolKind
from tests.principals import acting

Calls = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def worker(bare_worker: InProcessWorker) -> InProcessWorker:
    return bare_worker


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of a test, so a timed-out call's thread ends with it."""
    gate = threading.Event()
    yield gate
    gate.set()


def _agent(w: InProcessWorker, tools: list[Tool], *laps: Calls) -> str:
    def script(r: ModelRequest) -> ModelResponse:
        if r.lap > len(laps):
            return turn("done")
        return turn(f"lap {r.lap}", laps[r.lap - 1])

    w.rt.registry.register(Agent(name="pol", model=ScriptedModel(script), tools=tools))
    return "pol"


def _results(w: InProcessWorker, run_id: str) -> list[tuple[str, bool]]:
    return [(m.message.content, m.message.is_error) for m in w.messages(run_id)
            if m.message.role == "tool"]


def test_a_read_that_times_out_is_a_tool_error_the_model_sees(
        worker: InProcessWorker, release: threading.Event) -> None:
    @tool(timeout=0.2)
    def slow() -> str:
        """Hangs until the test ends."""
        release.wait(30)
        return "late"

    run = worker.start_run(_agent(worker, [slow], [("slow", {})]), "go")
    assert worker.wait(run.id, timeout=60).status == "succeeded"
    [(text, is_error)] = _results(worker, run.id)
    assert is_error and "did not finish within 0.2s" in text


def _hanging_pay(kind: ToolKind, landed: dict[str, int], release: threading.Event, *,
                 hangs: int, lookup: bool = False, retries: int = 0) -> Tool:
    """Applies the payment (counted per key, as a vendor would), then hangs
    ``hangs`` times before answering: the call landed but its answer is late."""
    left = {"n": hangs}

    @tool(kind=kind, timeout=0.2, retries=retries, backoff=0)
    def pay(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Pay once per key."""
        landed.setdefault(ctx.idempotency_key, 0)
        if kind != "idempotent" or not landed[ctx.idempotency_key]:
            landed[ctx.idempotency_key] += 1
        if left["n"]:
            left["n"] -= 1
            release.wait(30)
        return {"order": order}

    if lookup:
        pay.lookup(lambda key: {"order": "found"} if landed.get(key) else None)
    return pay


def test_an_effect_that_times_out_without_lookup_is_unknown_and_waits_for_a_human(
        worker: InProcessWorker, release: threading.Event) -> None:
    landed: dict[str, int] = {}
    pay = _hanging_pay("compensatable", landed, release, hangs=1, retries=3)
    run = worker.start_run(_agent(worker, [pay], [("pay", {"order": "o1"})]), "go")
    worker.run_until_idle()
    key = effect_key(run.id, 1, 0)
    paused = worker.get_run(run.id)
    assert (paused.status, paused.waiting_for) == ("waiting", f"effect:{key}")
    [effect] = worker.effects(run.id)
    assert effect.status == "unknown" and "did not finish within" in (effect.error or "")
    assert landed == {key: 1}, "a compensatable call that timed out is never retried"


def test_an_effect_that_times_out_is_adopted_when_its_lookup_finds_it(
        worker: InProcessWorker, release: threading.Event) -> None:
    landed: dict[str, int] = {}
    pay = _hanging_pay("compensatable", landed, release, hangs=1, lookup=True)
    run = worker.start_run(_agent(worker, [pay], [("pay", {"order": "o1"})]), "go")
    assert worker.wait(run.id, timeout=60).status == "succeeded"
    key = effect_key(run.id, 1, 0)
    assert landed == {key: 1}
    [effect] = worker.effects(run.id)
    assert (effect.status, effect.result) == ("applied", {"order": "found"})


@pytest.mark.parametrize("retries", [0, 1])
def test_an_idempotent_call_that_times_out_is_called_again_with_its_key(
        worker: InProcessWorker, release: threading.Event, retries: int) -> None:
    """With a retry left, the call retries in place; without, the effect stays
    pending and the lap is retried, whose replay calls again with the same key.
    Either way the vendor (deduplicating on the key) moved once."""
    landed: dict[str, int] = {}
    pay = _hanging_pay("idempotent", landed, release, hangs=1, retries=retries)
    run = worker.start_run(_agent(worker, [pay], [("pay", {"order": "o1"})]), "go")
    done = worker.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error_detail
    key = effect_key(run.id, 1, 0)
    assert landed == {key: 1}
    [effect] = worker.effects(run.id)
    assert (effect.status, effect.attempts) == ("applied", 2 - retries)
    assert json.loads(_results(worker, run.id)[0][0]) == {"order": "o1"}
    if not retries:
        assert any(e.kind == "retry" and "effect" in str(e.data)
                   for e in worker.events(run.id))


def test_retryable_errors_are_retried_with_the_same_key(worker: InProcessWorker) -> None:
    """A vendor's 503 twice, then success: one ledger row, one key, three attempts
    inside the call; a tool that stays unavailable past its retries is a tool error."""
    seen: list[str] = []
    flaky: Counter[str] = Counter()

    @tool(kind="idempotent", retries=2, backoff=0)
    def pay(order: str, ctx: ToolContext) -> str:
        """Unavailable for the first two attempts of o1, always for o2."""
        seen.append(ctx.idempotency_key)
        flaky[order] += 1
        if order == "o2" or flaky[order] <= 2:
            raise RetryableToolError("vendor answered 503")
        return "paid"

    run = worker.start_run(_agent(worker, [pay], [("pay", {"order": "o1"})],
                                  [("pay", {"order": "o2"})]), "go")
    assert worker.wait(run.id, timeout=60).status == "succeeded"
    k1, k2 = effect_key(run.id, 1, 0), effect_key(run.id, 2, 0)
    assert seen == [k1, k1, k1, k2, k2, k2]
    assert _results(worker, run.id) == [("paid", False), ("vendor answered 503", True)]
    assert [(e.key, e.status, e.attempts) for e in worker.effects(run.id)] == [
        (k1, "applied", 1), (k2, "failed", 1)]


def test_backoff_doubles_and_retries_check_the_lease_first() -> None:
    attempts: list[int] = []
    checks: list[int] = []

    @tool(retries=3, backoff=0.5)
    def flaky() -> str:
        """Fails three times."""
        attempts.append(1)
        if len(attempts) <= 3:
            raise RetryableToolError("busy")
        return "ok"

    slept: list[float] = []
    ctx = ToolContext(run_id="r", lap=1, call_index=0, idempotency_key="r:1:0")
    value = policy.invoke(flaky, flaky.validate({}), ctx, check=lambda: checks.append(1),
                          sleep=slept.append)
    assert (value, slept, len(checks)) == ("ok", [0.5, 1.0, 2.0], 3)


def test_a_timeout_is_retried_only_when_calling_again_is_safe(
        release: threading.Event) -> None:
    calls: Counter[str] = Counter()

    def hanging(kind: ToolKind) -> Tool:
        @tool(kind=kind, timeout=0.05, retries=2, backoff=0)
        def hang(ctx: ToolContext) -> None:
            """Never answers in time."""
            calls[kind] += 1
            release.wait(30)

        return hang

    ctx = ToolContext(run_id="r", lap=1, call_index=0, idempotency_key="r:1:0")
    for kind in ("read", "idempotent", "compensatable", "irreversible"):
        t = hanging(kind)
        with pytest.raises(ToolTimeoutError):
            policy.invoke(t, t.validate({}), ctx, check=lambda: None)
    assert calls == {"read": 3, "idempotent": 3, "compensatable": 1, "irreversible": 1}


@pytest.mark.parametrize("options", [{"timeout": 0}, {"timeout": -1}, {"timeout": "5"},
                                     {"retries": -1}, {"retries": 1.5}, {"retries": True},
                                     {"backoff": -1}, {"backoff": float("nan")}])
def test_policy_values_are_validated(options: dict[str, Any]) -> None:
    with pytest.raises(AgentDefinitionError, match="tool bad"):
        tool(name="bad", **options)(lambda: None)


def test_heartbeat_extends_the_lease_records_progress_and_stops_a_cancelled_call(
        worker: InProcessWorker) -> None:
    """While the call runs: its progress is visible (what `runs show` reads) and
    its heartbeat renews the lease; after a cancel, its next heartbeat raises,
    the call stops, and the run ends cancelled."""
    seen: dict[str, Any] = {}
    stop = threading.Event()

    @tool
    def crawl(ctx: ToolContext) -> str:
        """A long crawl that reports how far it got."""
        before = worker.get_run(ctx.run_id).lease_expires_at
        stop.wait(1.1)
        ctx.heartbeat(progress={"pages": 40, "of": 100, "token": "sk-" + "a" * 30})
        seen["progress"] = latest(worker.events(ctx.run_id), ctx.lap)
        seen["shown"] = _runs_show(worker, ctx.run_id)
        after = worker.get_run(ctx.run_id).lease_expires_at
        seen["extended"] = after is not None and before is not None and after > before
        acting(worker, "ops").cancel(ctx.run_id, reason="enough")
        stop.wait(1.1)
        try:
            ctx.heartbeat(progress={"pages": 41, "of": 100})
        except BaseException as e:
            seen["stopped"] = type(e).__name__
            raise
        return "finished anyway"

    run = worker.start_run(_agent(worker, [crawl], [("crawl", {})]), "go")
    done = worker.wait(run.id, timeout=60)
    assert done.status == "cancelled"
    [progress] = seen["progress"]
    assert (progress["call"], progress["tool"]) == (0, "crawl")
    assert progress["progress"] == {"pages": 40, "of": 100, "token": "[redacted]"}
    assert seen["extended"] and seen["stopped"] == "RunCancelled"
    shown_json, shown_text = seen["shown"]
    assert [(p["call"], p["progress"]["pages"]) for p in shown_json["progress"]] == [(0, 40)]
    assert 'call 0 crawl: {"pages": 40' in shown_text


def _runs_show(worker: InProcessWorker, run_id: str) -> tuple[dict[str, Any], str]:
    """`agent-worker runs show RUN` (JSON and text) on this worker's store."""
    api.configure(worker)
    try:
        runner = CliRunner()
        as_json = runner.invoke(cli_app, ["runs", "show", run_id, "--json"])
        as_text = runner.invoke(cli_app, ["runs", "show", run_id], env={"COLUMNS": "200"})
    finally:
        api.configure(None)
    assert as_json.exit_code == 0 and as_text.exit_code == 0, (as_json.output, as_text.output)
    return json.loads(as_json.stdout), as_text.stdout
