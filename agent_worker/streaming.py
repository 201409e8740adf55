"""Live streaming of a run: ``for event in stream(run_id, after=event_id)``.

The durable ``events`` table is the source of truth; a notification (Postgres
``LISTEN``/``NOTIFY``, see ``store.streamfeed``) only says "read now". A
reader keeps one cursor, the id of the last event it yielded, and every read
asks for events after it. Three rules make that cursor safe:

1. **Subscribe first, then read the backlog**: an event committed between the
   backlog read and the first wait still wakes the reader.
2. **Dedupe by id**: the cursor only moves forward; an id at or below it is
   never yielded again, so a reconnect with ``after=<last id seen>`` shows no
   event twice and skips none.
3. **Ids in commit order, per run**: a cursor would lose event 9 if event 10
   committed first and the reader moved past it. On Postgres the trigger of
   migration ``0006_stream_trace`` draws an event's id only under the run's
   row lock, so the events of one run are numbered in the order they commit;
   SQLite admits one writer at a time, which gives the same.

The stream ends after the run reaches a terminal status, with a synthetic
``end`` event (not stored; it carries the id of the last stored event, so
resuming after it yields just ``end`` again). A failed run that an operator
retries can be followed again from that id.

Token deltas of a model call in flight are not streamed: the model client
protocol returns a whole answer (see the README's section on streaming).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from agent_worker.core.errors import InvalidInputError
from agent_worker.core.messages import Message
from agent_worker.core.vocabulary import TERMINAL
from agent_worker.runtime import Runtime
from agent_worker.store.base import EventRecord, RunRecord
from agent_worker.store.sqlbase import SqlBase
from agent_worker.store.streamfeed import lap_messages, open_waiter

#: How long a reader waits for a notification before reading anyway: bounds
#: the delay when a notification is lost, and the interval of SSE keep-alives.
DEFAULT_POLL_SECONDS = 1.0


class EventSource(Protocol):
    """The reads a stream makes, all through the public API's run lookup
    (``AgentWorker``), so scoping them to a caller happens in one place."""

    rt: Runtime

    def get_run(self, run_id: str) -> RunRecord: ...

    def events(self, run_id: str, *, after_id: int = 0) -> list[EventRecord]: ...


@dataclass(frozen=True)
class StreamEvent:
    """One event of a run as a client sees it. ``messages`` are what a
    ``lap_committed`` lap wrote: the model's answer with its tool calls, then
    the tool results (empty for other kinds)."""

    id: int
    run_id: str
    lap: int | None
    kind: str
    data: dict[str, Any] | None
    created_at: datetime | None
    messages: tuple[Message, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The event as a JSON-ready dict (what ``runs follow --json`` and the
        SSE endpoint send)."""
        return {"id": self.id, "run_id": self.run_id, "lap": self.lap, "kind": self.kind,
                "data": self.data,
                "created_at": self.created_at.isoformat() if self.created_at else None,
                "messages": [m.model_dump(mode="json", exclude_defaults=True)
                             for m in self.messages]}


def check_after(after: object) -> int:
    """A resume point from outside (an argument, a ``Last-Event-ID`` header):
    a non-negative event id, or ``InvalidInputError``."""
    if isinstance(after, bool):
        raise InvalidInputError("after must be an event id (a non-negative integer)")
    if isinstance(after, str):
        text = after.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 19:
            raise InvalidInputError(
                "after must be an event id (a non-negative integer), got "
                f"{after[:40]!r}")
        return int(text)
    if not isinstance(after, int) or after < 0 or after >= 2 ** 63:
        raise InvalidInputError("after must be an event id (a non-negative integer)")
    return after


def follow(source: EventSource, run_id: str, *, after: int = 0,
           poll_seconds: float = DEFAULT_POLL_SECONDS,
           idle_ticks: bool = False) -> Generator[StreamEvent | None, None, None]:
    """The stream; see the module docstring. With ``idle_ticks`` a ``None`` is
    yielded whenever a wait ends with nothing new (the SSE endpoint turns it
    into a keep-alive and notices a client that left)."""
    cursor = check_after(after)
    if poll_seconds <= 0:
        raise InvalidInputError("poll_seconds must be positive")
    source.get_run(run_id)  # unknown run: UnknownRunError before anything else
    store = source.rt.store
    engine = store.engine if isinstance(store, SqlBase) else None
    waiter = open_waiter(engine, run_id)
    next_seq: int | None = None
    try:
        while True:
            # The status is read before the events: if it was terminal then,
            # the read below includes everything the ending committed.
            run = source.get_run(run_id)
            batch = [e for e in source.events(run_id, after_id=cursor) if e.id > cursor]
            for e in batch:
                cursor = e.id
                found: tuple[Message, ...] = ()
                if e.kind == "lap_committed" and e.lap is not None and engine is not None:
                    stored = lap_messages(engine, run_id, e.lap, from_seq=next_seq)
                    found = tuple(m.message for m in stored)
                    if stored:
                        next_seq = stored[-1].seq + 1
                yield StreamEvent(e.id, e.run_id, e.lap, e.kind, e.data, e.created_at, found)
            if run.status in TERMINAL:
                yield StreamEvent(cursor, run_id, None, "end", _ending(run), None)
                return
            if not waiter.wait(poll_seconds) and idle_ticks and not batch:
                yield None
    finally:
        waiter.close()


def stream(source: EventSource, run_id: str, *, after: int = 0,
           poll_seconds: float = DEFAULT_POLL_SECONDS) -> Iterator[StreamEvent]:
    """Every event of ``run_id`` after event id ``after``, as it commits,
    until the run ends (see the module docstring). A bad ``after`` or an
    unknown run raises here, at the call, not at the first ``next``."""
    after = check_after(after)
    source.get_run(run_id)
    return (e for e in follow(source, run_id, after=after, poll_seconds=poll_seconds)
            if e is not None)


def _ending(run: RunRecord) -> dict[str, Any]:
    return {"status": run.status, "result": run.result, "error_code": run.error_code,
            "error_message": run.error_message}


__all__ = ["DEFAULT_POLL_SECONDS", "EventSource", "StreamEvent", "check_after", "follow",
           "stream"]
