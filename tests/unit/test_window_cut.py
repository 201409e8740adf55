"""The window's token cut: the newest messages that fit ``window_tokens``
(the newest always kept), never opening on orphaned tool results, sized
by ``token_estimate`` once per stored message (the lap cache keeps the
same ``StoredMessage`` objects from lap to lap)."""

from __future__ import annotations

from datetime import UTC, datetime

from agent_worker import Agent, ScriptedModel, turn
from agent_worker.core.budget import Budget, BudgetLedger
from agent_worker.core.checkpoint import Checkpoint
from agent_worker.core.messages import Message, ToolCall, token_estimate
from agent_worker.engine.window import build_request
from agent_worker.store.base import StoredMessage


def _agent(tokens: int, messages: int = 40) -> Agent:
    return Agent(name="cut", model=ScriptedModel(lambda r: turn("done")),
                 window_tokens=tokens, window_messages=messages)


def _checkpoint(count: int) -> Checkpoint:
    return Checkpoint(lap=1, agent_name="cut", agent_version="1", message_count=count,
                      budget=BudgetLedger.start(Budget(), datetime.now(UTC)))


def _stored(contents: list[str]) -> list[StoredMessage]:
    return [StoredMessage(seq=i, lap=i, message=Message(role="user", content=c))
            for i, c in enumerate(contents)]


def test_estimate_counts_content_and_call_arguments() -> None:
    plain = Message(role="user", content="x" * 400)
    assert token_estimate(plain) == 100 + 4
    call = ToolCall(id="c1", name="look", arguments={"n": "y" * 39})  # {"n": "y…y"}: 48 bytes
    assert token_estimate(Message(role="assistant", content="", tool_calls=(call,))) \
        == 0 + (48 // 4 + 8) + 4


def test_cut_keeps_the_newest_messages_that_fit() -> None:
    window = _stored(["a" * 400, "b" * 400, "c" * 400, "d" * 400])  # 104 tokens each
    request = build_request(_agent(tokens=250), "r", 5, _checkpoint(4), window, "k")
    assert [m.content[0] for m in request.messages] == ["c", "d"]


def test_the_newest_message_is_kept_even_when_alone_over_budget() -> None:
    window = _stored(["a" * 40, "b" * 4000])
    request = build_request(_agent(tokens=100), "r", 5, _checkpoint(2), window, "k")
    assert [m.content[0] for m in request.messages] == ["b"]


def test_message_limit_applies_before_the_token_limit() -> None:
    window = _stored(["a", "b", "c", "d", "e"])
    request = build_request(_agent(tokens=10_000, messages=2), "r", 5, _checkpoint(5),
                            window, "k")
    assert [m.content for m in request.messages] == ["d", "e"]


def test_the_estimate_is_taken_once_per_stored_message() -> None:
    """Rebuilding the window from the same stored messages reuses their size:
    a later change to the cached value shows, so the second build did not
    recount (it is a cache, not a second computation that happens to agree)."""
    window = _stored(["a" * 400, "b" * 400, "c" * 400])
    agent = _agent(tokens=250)
    first = build_request(agent, "r", 5, _checkpoint(3), window, "k")
    assert [m.content[0] for m in first.messages] == ["b", "c"]
    assert all("tokens" in vars(m) for m in window[1:])
    vars(window[1])["tokens"] = 10_000  # as if b were huge: a recount would say 104
    second = build_request(agent, "r", 6, _checkpoint(3), window, "k")
    assert [m.content[0] for m in second.messages] == ["c"]
