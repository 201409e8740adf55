"""``runs show --laps`` and ``runs tail`` know a tool call by (lap, call index),
as its effect key does, never by the provider's call id alone: providers reuse
ids across turns (the scripted model says ``call_0`` on every lap), and keying
by id showed every lap the last lap's effect (a read shown as ``idempotent
applied``, lap 1's key as ``run:19:0``)."""

from __future__ import annotations

from datetime import UTC, datetime

from agent_worker.cli.views import LapBook
from agent_worker.core.messages import Message, ToolCall
from agent_worker.store.base import EffectRecord, EventRecord, StoredMessage

AT = datetime(2026, 11, 30, tzinfo=UTC)


def asks(seq: int, lap: int, *names: str) -> StoredMessage:
    calls = tuple(ToolCall(id=f"call_{i}", name=n) for i, n in enumerate(names))
    return StoredMessage(seq, lap, Message(role="assistant", tool_calls=calls))


def answer(seq: int, lap: int, call_id: str, name: str) -> StoredMessage:
    return StoredMessage(seq, lap, Message(role="tool", tool_call_id=call_id, name=name,
                                           content="ok"))


def effect(lap: int, index: int, tool: str) -> EffectRecord:
    return EffectRecord(key=f"r:{lap}:{index}", run_id="r", lap=lap, call_index=index,
                        tool_name=tool, tool_version="1", kind="idempotent", args_hash="h",
                        args={}, status="applied", result=None, error=None, attempts=1,
                        compensates=None, created_at=AT, updated_at=AT)


def committed(lap: int) -> EventRecord:
    return EventRecord(id=lap, run_id="r", lap=lap, kind="lap_committed", data={}, created_at=AT)


def tools_of(book: LapBook, lap: int) -> list[tuple[str, object, object]]:
    return [(t["name"], t["call_lap"], t["effect"] and t["effect"]["key"])
            for t in book.lap(committed(lap))["tools"]]


def test_reused_call_ids_keep_each_lap_its_own_effect() -> None:
    book = LapBook("r")
    book.add_messages([asks(1, 1, "get_order"), answer(2, 1, "call_0", "get_order"),
                       asks(3, 2, "refund"), answer(4, 2, "call_0", "refund")])
    book.add_effects([effect(2, 0, "refund")])
    assert tools_of(book, 1) == [("get_order", 1, None)]
    assert tools_of(book, 2) == [("refund", 2, "r:2:0")]


def test_a_paused_call_answered_laps_later_keeps_its_origin() -> None:
    """Lap 3 asks two calls; the second waits for an approval and is answered in
    lap 5, after lap 4 reused its id; fed one message at a time, as tail does."""
    book = LapBook("r")
    for m in [asks(1, 3, "get_order", "close"), answer(2, 3, "call_0", "get_order"),
              asks(3, 4, "get_order", "close"), answer(4, 4, "call_0", "get_order"),
              answer(5, 5, "call_1", "close"), answer(6, 5, "call_1", "close")]:
        book.add_messages([m])
    book.add_effects([effect(3, 1, "close"), effect(4, 1, "close")])
    assert tools_of(book, 5) == [("close", 3, "r:3:1"), ("close", 4, "r:4:1")]
