"""``tasks.consumer.LapConsumer``'s timed flush of task events, against a
stand-in for kombu's event loop (the hook's logic only; a real worker's
events are checked in tests/integration/test_event_publish.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks.consumer import EVENT_FLUSH_SECONDS, LapConsumer


class _Loop:
    """Records what the consumer asks of kombu's hub; runs it on demand."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []
        self.later: list[tuple[float, Callable[[], None]]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.later.append((delay, callback))

    def turn(self) -> None:
        """The loop's next turn: its ready callbacks, then every timer due."""
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()
        later, self.later = self.later, []
        for _, callback in later:
            callback()


def _consumer() -> tuple[Any, _Loop, list[int]]:
    consumer: Any = LapConsumer.__new__(LapConsumer)  # no broker: the hook alone
    loop, flushes = _Loop(), []
    consumer.hub = loop
    consumer._flush_events = lambda: flushes.append(1)
    return consumer, loop, flushes


def test_events_buffered_before_a_flush_share_it() -> None:
    consumer, loop, flushes = _consumer()
    for _ in range(5):
        consumer.on_send_event_buffered()
    assert len(loop.soon) == 1, "one flush asked for, however many events"
    loop.turn()
    assert flushes == [1]


def test_the_flush_waits_for_its_timer_and_a_later_event_asks_again() -> None:
    consumer, loop, flushes = _consumer()
    consumer.on_send_event_buffered()
    loop.soon.pop()()  # the loop's turn sets the timer...
    assert [delay for delay, _ in loop.later] == [EVENT_FLUSH_SECONDS] and flushes == []
    consumer.on_send_event_buffered()
    assert loop.soon == [], "a flush is already due"
    loop.later.pop()[1]()  # ...which flushes
    assert flushes == [1]
    consumer.on_send_event_buffered()
    assert len(loop.soon) == 1, "an event after the flush asks for the next one"


def test_a_worker_without_an_event_loop_is_left_alone() -> None:
    consumer, _, flushes = _consumer()
    consumer.hub = None
    consumer.on_send_event_buffered()
    assert flushes == [] and not consumer._flush_due
