"""The worker's consumer, with its task events flushed at most every 50 ms.

Celery buffers a worker's task events (``task-received``, ``-started``,
``-succeeded``) and asks its event loop to flush them at the next turn: one
publish for every turn that buffered one, two or three per lap, each a
kombu ``Producer.publish`` on the consumer's thread, the thread that also
takes every lap message off Redis. Flushed by a timer instead, a busy
worker publishes one batch per ``EVENT_FLUSH_SECONDS`` (or per 24 events,
Celery's own limit) whatever its lap rate: a threads worker running many
laps at once moved 446 -> 480 laps/s on 2.29 -> 2.01 ms of CPU a lap
(``python -m bench.tree_throughput``; BENCHMARKS.md, "Task events in timed
batches").

What a monitor sees: every event, up to ``EVENT_FLUSH_SECONDS`` later, with
its own timestamp (Flower's times and runtimes are the events', not their
arrival's). Celery's own flush of a full buffer (24 events) stays as it is,
and a worker shutting down flushes what is buffered before it closes.
"""

from __future__ import annotations

from typing import Any, cast

from celery.worker.consumer import Consumer

EVENT_FLUSH_SECONDS = 0.05
"""How long a buffered task event may wait for its batch."""


class LapConsumer(Consumer):
    """Celery's consumer with a timed flush of buffered task events."""

    _flush_due = False

    # celery-types types the hook as returning a callable; Celery's returns nothing.
    def on_send_event_buffered(self) -> None:  # type: ignore[override]
        # Called by whichever thread buffered the event (a threads pool's lap
        # thread too): only the event loop's own thread may set a timer, so
        # the timer is set from a callback the loop runs at its next turn.
        if self._loop is not None and not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush_later)

    @property
    def _loop(self) -> Any:
        # Any: celery-types' Consumer lists neither ``hub`` nor ``_flush_events``.
        return cast(Any, self).hub

    def _flush_later(self) -> None:
        self._loop.call_later(EVENT_FLUSH_SECONDS, self._flush_now)

    def _flush_now(self) -> None:
        # Cleared first: an event buffered during the flush asks for the next one.
        self._flush_due = False
        cast(Any, self)._flush_events()

    def shutdown(self) -> None:
        cast(Any, self)._flush_events()
        super().shutdown()


__all__ = ["EVENT_FLUSH_SECONDS", "LapConsumer"]
