"""Hostile payloads, in-process on SQLite and on Postgres: text the
database cannot hold, errors whose recording fails, limits, deep JSON, look-alike
identifiers, secrets. Each test names the problem it guards against."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from agent_worker import Agent, InProcessWorker, ScriptedModel, register, tool, turn
from agent_worker.control import wait_for_signal_tool
from agent_worker.core.errors import (
    InvalidInputError,
    InvalidStateError,
    NestingTooDeepError,
    NotFoundError,
    PayloadTooLargeError,
    ToolError,
)
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.store.sql import SqlStore
from agent_worker.tools import ToolContext
from tests.principals import acting

FFFD = "\ufffd"
HOSTILE = "a\x00b\ud800c\udfffd"
CLEANED = f"a{FFFD}b{FFFD}c{FFFD}d"
calls: dict[str, int] = {}


@pytest.fixture
def worker(dialect_url: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(dialect_url, retry_backoff_seconds=0, max_lap_attempts=3,
                        max_tool_result_bytes=2000, max_pending_signals=3, max_json_depth=20)
    yield w
    assert isinstance(w.rt.store, SqlStore)
    w.rt.store.dispose()


@tool(kind="idempotent")
def echo_hostile(text: str, ctx: ToolContext) -> dict[str, Any]:
    """Lands an effect (counted), answers with what Postgres cannot hold."""
    calls[ctx.idempotency_key] = calls.get(ctx.idempotency_key, 0) + 1
    return {"got": text, f"key{HOSTILE}": HOSTILE, "n": [HOSTILE]}


@tool(kind="idempotent")
def refuse(why: str) -> None:
    """Fails with the given text, like a vendor error carrying binary junk."""
    raise ToolError(why)


@tool(kind="idempotent", approval=True)
def echo_approved(text: str) -> str:
    """Needs a human first."""
    return text


@tool(kind="compensatable")
def hold(text: str) -> str:
    """A saga step whose undo answers with what Postgres cannot hold."""
    return text


@hold.compensator
def _release_hold(args: dict[str, Any], result: Any, ctx: ToolContext) -> str:
    return f"released {args['text']}{HOSTILE}"


@tool
def crash(why: str) -> None:
    """Fails with an exception that is not a ToolError: a lap error."""
    raise RuntimeError(why)


@tool
def produce(kind: str, size: int = 0) -> Any:
    """Returns something too big or too deep."""
    if kind == "big":
        return "x" * size
    value: Any = "leaf"
    for _ in range(size):
        value = [value]
    return value


TOOLS = [echo_hostile, echo_approved, hold, refuse, crash, produce, wait_for_signal_tool]


def _scripted(name: str, first: ModelResponse, final: str = "done", **kw: Any) -> str:
    """An agent whose lap 1 is ``first`` and whose lap 2 answers ``final``."""
    def script(r: ModelRequest) -> ModelResponse:
        return first if r.lap == 1 else turn(final)

    register(Agent(name=name, model=ScriptedModel(script), tools=TOOLS, window_messages=200,
                   **kw))
    return name


def _tool_messages(w: InProcessWorker, run_id: str) -> list[tuple[str, bool]]:
    return [(m.message.content, m.message.is_error) for m in w.messages(run_id)
            if m.message.role == "tool"]


# --- U+0000 and lone surrogates (problem 1) ----------------------------------------------


def test_tool_result_and_model_text_postgres_cannot_hold_are_stored_by_the_rule(
        worker: InProcessWorker) -> None:
    """Was: the Postgres lap commit failed on every attempt (the model output is
    journaled), leaving an idempotent refund that landed behind a failed run."""
    name = _scripted("h-nul", turn(f"thinking{HOSTILE}", [("echo_hostile", {"text": HOSTILE})]),
                     final=f"done{HOSTILE}")
    run = worker.start_run(name, {"q": HOSTILE})
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded", done.error_message
    assert done.result == f"done{CLEANED}"
    [effect] = worker.effects(run.id)
    assert calls[effect.key] == 1 and effect.status == "applied"
    expected = {"got": CLEANED, f"key{CLEANED}": CLEANED, "n": [CLEANED]}
    assert effect.result == expected and effect.args == {"text": CLEANED}
    bodies = [m.message for m in worker.messages(run.id)]
    assert json.loads(bodies[0].content) == {"q": CLEANED}
    assert bodies[1].content == f"thinking{CLEANED}"
    assert bodies[1].tool_calls[0].arguments == {"text": CLEANED}
    assert json.loads(bodies[2].content) == expected
    assert worker.get_run(run.id).input == {"q": CLEANED}


def test_tool_error_text_with_nul_reaches_the_model_cleaned(worker: InProcessWorker) -> None:
    """Was: the ToolError text went into a text column as sent (DataError)."""
    name = _scripted("h-toolerr", turn("", [("refuse", {"why": HOSTILE})]))
    run = worker.start_run(name)
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    [effect] = worker.effects(run.id)
    assert (effect.status, effect.error) == ("failed", CLEANED)
    assert _tool_messages(worker, run.id) == [(CLEANED, True)]


def test_lap_error_with_nul_is_recorded_and_nothing_escapes(worker: InProcessWorker) -> None:
    """Was: recording the error raised DataError out of ``run_lap`` (and out of
    ``run_until_idle`` into the host application); the real error was lost."""
    name = _scripted("h-laperr", turn("", [("crash", {"why": HOSTILE})]))
    run = worker.start_run(name)
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert (done.status, done.error_code) == ("failed", "lap_error")
    assert done.error_message == CLEANED
    assert done.error_detail is not None and CLEANED in done.error_detail
    assert done.lease_owner is None


def test_model_picked_signal_name_with_nul_is_a_tool_error(worker: InProcessWorker) -> None:
    """Was: the name went into ``waiting_for`` and the signal filter: the run failed."""
    name = _scripted("h-signame", turn("", [("wait_for_signal", {"name": f"go{HOSTILE}"})]))
    run = worker.start_run(name)
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    [(content, is_error)] = _tool_messages(worker, run.id)
    assert is_error and content.startswith("signal name must be")


def test_compensation_result_with_nul_is_stored_by_the_rule(worker: InProcessWorker) -> None:
    """Was: the undo's result went to the ledger as returned: the Postgres write failed
    and the run kept failing to compensate."""
    name = _scripted("h-undo", turn("", [("hold", {"text": "h"}), ("crash", {"why": "no"})]))
    run = worker.start_run(name)
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert (done.status, done.error_code) == ("failed", "lap_error")
    effects = {e.tool_name: e for e in worker.effects(run.id)}
    assert effects["hold"].status == "compensated"
    assert effects["hold:undo"].result == f"released h{CLEANED}"


# --- the error path can never raise (problem 2) --------------------------------------------


@pytest.mark.parametrize("failures", [1, 99], ids=["reduced", "lease-lapses"])
def test_error_path_records_a_reduced_error_when_recording_fails(
        worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    """Whatever fails while recording an error, the lap ends without raising:
    first the error is recorded reduced (code and short cleaned message, no
    traceback); if that fails too, the lease is left to lapse."""
    name = _scripted("h-errpath", turn("", [("crash", {"why": "x" * 5000})]))
    run = worker.start_run(name)
    store = worker.rt.store
    real = store.release
    seen: list[Any] = []

    def failing_release(*args: Any, **kw: Any) -> bool:
        seen.append(kw["outcome"])
        if len(seen) <= failures:
            raise RuntimeError("the database refused the text")
        return real(*args, **kw)

    monkeypatch.setattr(store, "release", failing_release)
    from agent_worker.engine.lap import run_lap

    outcome = run_lap(worker.rt, run.id, 1)
    assert outcome == "retrying"
    r = worker.get_run(run.id)
    if failures == 1:
        assert seen[0].error_detail is not None and seen[1].error_detail is None
        assert (r.status, r.error_code, r.error_detail) == ("queued", "lap_error", None)
        assert r.error_message is not None and r.error_message.startswith("RuntimeError: xxx")
        assert len(r.error_message) < 600 and r.lease_owner is None
    else:
        assert len(seen) == 2 and r.status == "running"
        assert r.lease_owner is not None  # left to lapse; the sweeper re-sends the lap


# --- limits (problem 3) --------------------------------------------------------------------


def _waiting(worker: InProcessWorker, name: str) -> str:
    agent = _scripted(name, turn("", [("wait_for_signal", {"name": "go"})]))
    run = worker.start_run(agent)
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "waiting"
    return run.id


def test_signal_payload_has_the_tool_result_limit(worker: InProcessWorker) -> None:
    """Was: a 30 MB payload was accepted and delivered as a 30 MB tool message."""
    run_id = _waiting(worker, "h-sigsize")
    with pytest.raises(PayloadTooLargeError):
        worker.send_signal(run_id, "go", {"blob": "x" * 2001})
    assert worker.get_run(run_id).status == "waiting"
    worker.send_signal(run_id, "go", {"blob": HOSTILE})
    worker.run_until_idle()
    assert worker.get_run(run_id).status == "succeeded"
    [(content, is_error)] = _tool_messages(worker, run_id)
    assert not is_error and json.loads(content)["payload"] == {"blob": CLEANED}


def test_undelivered_signals_per_run_are_bounded(worker: InProcessWorker) -> None:
    """Was: thousands of signals were accepted on one run."""
    run_id = _waiting(worker, "h-sigcount")
    for i in range(3):
        worker.send_signal(run_id, "other", i)
    with pytest.raises(InvalidStateError, match="undelivered"):
        worker.send_signal(run_id, "other", 3)


def test_oversized_tool_result_is_refused_and_not_kept_in_full(
        worker: InProcessWorker) -> None:
    """Was: refused to the model but stored in full in the effect ledger."""
    name = _scripted("h-bigresult", turn("", [("produce", {"kind": "big", "size": 50_000}),
                                              ("echo_hostile", {"text": "y" * 3000})]))
    run = worker.start_run(name)
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"
    results = _tool_messages(worker, run.id)
    assert [e for _, e in results] == [True, True]
    assert all(c.startswith("Tool result too large (") for c, _ in results)
    [effect] = worker.effects(run.id)
    assert effect.result["bytes"] > 3000 and len(effect.result["prefix"]) == 1000


# --- deep JSON (problem 4) -------------------------------------------------------------------


def _deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = {"a": [value]}
    return value


def test_deep_json_is_refused_clearly_everywhere(worker: InProcessWorker) -> None:
    """Was: a raw RecursionError (CLI: ``error: internal``)."""
    with pytest.raises(NestingTooDeepError):
        worker.start_run(_scripted("h-deep-in", turn("ok")), _deep(5000))
    run_id = _waiting(worker, "h-deep-sig")
    with pytest.raises(NestingTooDeepError):
        worker.send_signal(run_id, "go", _deep(5000))
    name = _scripted("h-deep", turn("", [("produce", {"kind": "deep", "size": 5000}),
                                         ("echo_hostile", {"text": _deep(5000)})]),
                     final="[" * 5000 + "]" * 5000)
    run = worker.start_run(name)
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "succeeded" and done.result == "[" * 5000 + "]" * 5000
    (result, e1), (args, e2) = _tool_messages(worker, run.id)
    assert e1 and "nested deeper than 20 levels" in result
    assert e2 and args.startswith("Invalid arguments for echo_hostile: arguments: nested")
    assert worker.effects(run.id) == []


USAGE_OUT_OF_RANGE = {"refund-in": (-10_000, 5), "refund-out": (5, -1),
                      "past-64-bits": (2**63, 1), "absurd": (10**30, 10**30)}


@pytest.mark.parametrize("case", list(USAGE_OUT_OF_RANGE))
def test_token_usage_out_of_range_is_malformed_output_and_charges_nothing(
        worker: InProcessWorker, case: str) -> None:
    """Charged as reported, negative usage would shrink the run's budget
    totals, and a count past 64 bits would fail the lap commit as a database
    error; either is refused like any other malformed answer, on every
    attempt, and the totals stay as they were."""
    wild = turn("", [("echo_hostile", {"text": "x"})], usage=USAGE_OUT_OF_RANGE[case])
    run = worker.start_run(_scripted(f"h-usage-{case}", wild))
    worker.run_until_idle()
    done = worker.get_run(run.id)
    assert (done.status, done.error_code) == ("failed", "malformed_model_output")
    assert done.error_message is not None and "usage out of range" in done.error_message
    assert (done.input_tokens, done.output_tokens) == (0, 0)
    assert worker.effects(run.id) == []


# --- identifiers and operator text (problem 5) ------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"run_id": "ticket-1\n"}, {"tenant": "acme\n"},
                                    {"run_id": "a\x00"}, {"tenant": "ac\u202eme"}])
def test_look_alike_identifiers_are_refused(worker: InProcessWorker,
                                            kwargs: dict[str, Any]) -> None:
    """Was: ``$`` matched before a trailing newline, creating look-alike runs."""
    with pytest.raises(InvalidInputError):
        worker.start_run(_scripted("h-ids", turn("ok")), "hi", **kwargs)
    assert worker.list_runs(agent="h-ids") == []


def test_look_alike_agent_tool_and_signal_names_are_refused(worker: InProcessWorker) -> None:
    with pytest.raises(InvalidInputError):
        Agent(name="agent\n", model=ScriptedModel(lambda r: turn("ok")))
    with pytest.raises(InvalidInputError):
        tool(name="pay\n")(lambda: None)
    run_id = _waiting(worker, "h-signal-id")
    with pytest.raises(InvalidInputError):
        worker.send_signal(run_id, "go\n", 1)
    with pytest.raises(InvalidInputError):  # max_signal_name_chars (100)
        worker.send_signal(run_id, "g" * 101, 1)


def test_operator_text_is_bounded_and_stored_by_the_rule(worker: InProcessWorker) -> None:
    """Was: NUL-bearing or over-long reasons, comments and ``by`` raised raw
    SQLAlchemy errors on Postgres. ``by`` is now the principal's id: bounded and
    cleaned the same way when the principal is made."""
    name = _scripted("h-approve", turn("", [("echo_approved", {"text": "x"})]),
                     approval_owner="ops")
    run = worker.start_run(name)
    worker.run_until_idle()
    with pytest.raises(InvalidInputError):
        acting(worker, "x" * 201).approve(run.id)
    with pytest.raises(InvalidInputError):
        acting(worker, "ops").approve(run.id, comment="c" * 4001)
    decided = acting(worker, f"ops{HOSTILE}").approve(run.id, comment=f"fine{HOSTILE}")
    assert (decided.decided_by, decided.comment) == (f"ops{CLEANED}", f"fine{CLEANED}")
    worker.run_until_idle()
    assert worker.get_run(run.id).status == "succeeded"

    other = _waiting(worker, "h-cancel")
    with pytest.raises(InvalidInputError):
        worker.cancel(other, reason="r" * 2001)
    with pytest.raises(InvalidInputError):
        acting(worker, "b" * 201).cancel(other, reason="r")
    acting(worker, f"me{HOSTILE}").cancel(other, reason=f"stop{HOSTILE}")
    worker.run_until_idle()
    r = worker.get_run(other)
    assert (r.status, r.cancel_reason, r.cancelled_by) == (
        "cancelled", f"stop{CLEANED}", f"me{CLEANED}")


def test_references_that_cannot_exist_are_not_found(worker: InProcessWorker) -> None:
    """Was: a NUL in a looked-up id reached Postgres as a parameter: a raw error."""
    bad = f"run{HOSTILE}"
    for call in (lambda: worker.get_run(bad), lambda: worker.cancel(bad, reason="r"),
                 lambda: worker.send_signal(bad, "go", 1), lambda: worker.retry(bad),
                 lambda: acting(worker, "ops").approve(bad), lambda: worker.events(bad),
                 lambda: acting(worker, "ops").resolve_effect(f"{bad}:1:0", applied=True)):
        with pytest.raises(NotFoundError):
            call()
    assert worker.list_runs(tenant=bad) == [] and worker.list_approvals(run_id=bad) == []


# --- secrets (problem 7) ------------------------------------------------------------------------


SECRET_URL = "GET https://api.weather.test/data?q=Oslo&appid=sk_live_51Habcdefghijkl failed"


def test_credentials_in_tool_errors_and_results_are_redacted(
        worker: InProcessWorker, caplog: pytest.LogCaptureFixture) -> None:
    """Was: stored (and logged) with the credential in it."""
    name = _scripted("h-secrets", turn("", [
        ("refuse", {"why": SECRET_URL}),
        ("echo_hostile", {"text": "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc"}),
        ("crash", {"why": "token=ghp_0123456789abcdefghij0123456789"})]))
    run = worker.start_run(name)
    with caplog.at_level(logging.INFO):
        worker.run_until_idle()
    done = worker.get_run(run.id)
    assert done.status == "failed"
    stored = " ".join([str(e.error) + str(e.result) for e in worker.effects(run.id)]
                      + [m.message.content for m in worker.messages(run.id)
                         if m.message.role == "tool"]
                      + [done.error_message or "", done.error_detail or ""])
    for secret in ("sk_live_51Habcdefghijkl", "eyJhbGciOiJIUzI1NiJ9", "ghp_0123456789"):
        assert secret not in stored and secret not in caplog.text
    assert "appid=[redacted]" in stored and "Bearer [redacted]" in stored
    assert "failed for good" in caplog.text  # the log was captured


def test_redaction_hook_can_be_replaced(worker: InProcessWorker) -> None:
    name = _scripted("h-noredact", turn("", [("refuse", {"why": SECRET_URL})]), redact=None)
    run = worker.start_run(name)
    worker.run_until_idle()
    assert _tool_messages(worker, run.id) == [(SECRET_URL, True)]


def test_sql_errors_do_not_quote_parameters(worker: InProcessWorker) -> None:
    """Was: a failed statement's error carried its bind parameters (message bodies)."""
    store = worker.rt.store
    assert isinstance(store, SqlStore)
    with pytest.raises(Exception) as caught, store.engine.connect() as conn:
        conn.execute(text("SELECT x FROM no_such_table WHERE x = :p"), {"p": "secret-body-text"})
    assert "secret-body-text" not in str(caught.value)
