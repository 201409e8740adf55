"""The console's own live stream: server-sent events behind the console's
login, so the pages update without a reload and without a second server.

Two feeds on one route, each acting as the visitor (``AgentWorker.acting_as``
the session's principal: another tenant's runs and approvals never appear):

- ``GET /stream?run=<id>``: one run's events, the feed of ``agent_worker.sse``
  (``streaming.follow``: ``LISTEN`` on the run's channel, the ``events`` table
  the truth, resumed after ``Last-Event-ID``). Each is sent as ``event: run``
  with its id, kind and lap (a browser's ``EventSource`` cannot listen to
  every kind by name, and the page re-reads its own fragment rather than the
  messages), then ``event: end`` once the run has ended. Without a
  ``Last-Event-ID`` it starts at the run's latest event: the page already
  shows the past. Another tenant's run is a 404 like a run nobody has.
- ``GET /stream[?list=<the runs page's query>]``: the overview. Every
  ``console_poll_seconds`` it reads the visitor's pending approvals
  (``approvals.waiting``: the badge and the inbox) and, given a list, that
  list's first page (``runs.listed``: one indexed page read, the query the
  page itself makes), and sends an ``approvals`` or ``runs`` event when what
  they show changed. There is no tenant-wide notification channel to listen
  on (the event trigger notifies per followed run), so this is a poll, but on
  the server: one bounded read per interval per open page instead of a
  browser fetching the whole page.

What it races with, and why that is safe: the overview sends *states*, not
changes, and its first event comes at once; a page compares it with the
digest it was rendered with, so a run that moved between the page's snapshot
and the subscription shows on arrival, and a reconnect loses nothing (it
starts with the state again). The run feed resumes by event id; the page
re-reads its fragment once when the stream opens, which covers events
committed between the page's render and the subscription.

Limits: ``PER_SESSION`` open streams per session (a few tabs, each with the
overview and a run) and ``RUN_STREAMS`` run feeds per process (each holds a
Postgres connection and, while it waits, a thread of the server's pool, the
one the pages run in); past either, a 429 or 503 and the page polls instead.
Each stream ends after ``LIFETIME_SECONDS`` (the browser reconnects by itself,
logging in again) and as soon as its session is logged out. The response goes
through the security headers middleware, which adds headers and passes every
body chunk on as it comes: nothing buffers it (``X-Accel-Buffering: no``
tells a proxy in front the same).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agent_worker.api import AgentWorker
from agent_worker.console import approvals, runs
from agent_worker.console.context import Console, Ctx, visitor_of
from agent_worker.console.session import Visitor
from agent_worker.core.errors import AgentWorkerError, NotFoundError, PermissionDeniedError
from agent_worker.store import tenancy
from agent_worker.store.rows import events
from agent_worker.store.sqlbase import SqlBase
from agent_worker.streaming import check_after, follow

#: Open streams one session may hold at once.
PER_SESSION = 8
#: Run feeds one console process serves at once (each holds a thread while it waits).
RUN_STREAMS = 16
#: How long one stream lives before the browser reconnects (and re-authenticates).
LIFETIME_SECONDS = 600.0
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Gate:
    """Counts open streams, per session and run feeds per process. Taken and
    released from the event loop and from the pool's threads, hence the lock."""

    def __init__(self, per_session: int = PER_SESSION, run_streams: int = RUN_STREAMS) -> None:
        self.per_session = per_session
        self.run_streams = run_streams
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._runs = 0

    def take(self, session: str, *, run: bool) -> Response | None:
        """A slot, or the refusal to send instead."""
        with self._lock:
            if self._open.get(session, 0) >= self.per_session:
                return PlainTextResponse(f"at most {self.per_session} live streams per session",
                                         status_code=429)
            if run and self._runs >= self.run_streams:
                return PlainTextResponse("too many live run streams; the page polls",
                                         status_code=503)
            self._open[session] = self._open.get(session, 0) + 1
            self._runs += run
            return None

    def release(self, session: str, *, run: bool) -> None:
        with self._lock:
            left = self._open.get(session, 0) - 1
            if left > 0:
                self._open[session] = left
            else:
                self._open.pop(session, None)
            self._runs -= run


def session_key(visitor: Visitor) -> str:
    """What a per-session limit counts: the session's nonce, or the proxy's user."""
    return visitor.nonce or f"proxy:{visitor.user.id}"


def state(aw: AgentWorker, ctx: Ctx | None, listing: runs.RunQuery | None) -> dict[str, Any]:
    """What the overview sends: the visitor's approvals and, for a list, its digest."""
    found: dict[str, Any] = {"approvals": approvals.waiting(aw)}
    if listing is not None and ctx is not None:
        rows, _ = runs.listed(ctx, listing)
        found["runs"] = {"digest": runs.digest(rows)}
    return found


def last_event_id(aw: AgentWorker, run_id: str) -> int:
    """The run's latest event id (0: none yet); call after ``get_run``
    authorized the visitor. One probe of ``ix_events_run``."""
    store = aw.rt.store
    if not isinstance(store, SqlBase):
        return 0
    with tenancy.scope(aw.principal.tenant), store.engine.connect() as conn:
        found = conn.execute(select(func.max(events.c.id))
                             .where(events.c.run_id == run_id)).scalar()
    return int(found or 0)


def _frame(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def stream_routes(console: Console, *, lifetime: float = LIFETIME_SECONDS,
                  gate: Gate | None = None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The endpoints ``GET /stream`` and ``GET /stream/state`` (the overview
    as one JSON answer: what a page without ``EventSource`` polls)."""
    slots = gate or Gate()
    tick = console.settings.console_poll_seconds

    async def who(request: Request) -> tuple[Visitor, AgentWorker] | Response:
        visitor = await visitor_of(console, request)
        if isinstance(visitor, Response):
            return visitor
        if visitor is None:
            return PlainTextResponse("log in first", status_code=401)
        return visitor, console.aw.acting_as(visitor.user.principal)

    def listing_of(request: Request, visitor: Visitor,
                   aw: AgentWorker) -> tuple[Ctx | None, runs.RunQuery | None]:
        raw = request.query_params.get("list")
        if raw is None:
            return None, None
        from_page = Request({**request.scope, "query_string": raw.encode()})
        ctx = Ctx(console, from_page, visitor, aw)
        return ctx, runs.RunQuery.parse(from_page.query_params)

    async def snapshot(request: Request) -> Response:
        found = await who(request)
        if isinstance(found, Response):
            return found
        visitor, aw = found
        try:
            ctx, listing = listing_of(request, visitor, aw)
            return JSONResponse(await run_in_threadpool(state, aw, ctx, listing))
        except AgentWorkerError as e:
            return _refusal(e)

    async def stream(request: Request) -> Response:
        found = await who(request)
        if isinstance(found, Response):
            return found
        visitor, aw = found
        run_id = request.query_params.get("run")
        try:
            if run_id is not None:
                raw = request.headers.get("last-event-id") or request.query_params.get("after")
                after = check_after(raw) if raw is not None else None
                await run_in_threadpool(aw.get_run, run_id)
                if after is None:
                    after = await run_in_threadpool(last_event_id, aw, run_id)
                ctx, listing, first = None, None, {}
            else:
                ctx, listing = listing_of(request, visitor, aw)
                # Read before answering: a bad list (a forged cursor) is a 400
                # here, not a stream that fails and reconnects every second.
                first = await run_in_threadpool(state, aw, ctx, listing)
        except AgentWorkerError as e:
            return _refusal(e)
        key = session_key(visitor)
        refused = slots.take(key, run=run_id is not None)
        if refused is not None:
            return refused
        still_in = _session_check(console, request, tick)
        # Released when the body ends, or when it is dropped unstarted (a
        # client gone before the first byte): a generator that never ran
        # runs no ``finally``, and a leaked slot would be lost for good.
        slot: list[weakref.finalize[Any, Any]] = []
        body: Iterator[str] | AsyncIterator[str]
        if run_id is not None:
            body = _run_feed(aw, run_id, after or 0, tick, lifetime, still_in,
                             lambda: slot[0]())
        else:
            body = _overview(aw, ctx, listing, first, tick, lifetime, still_in,
                             lambda: slot[0]())
        slot.append(weakref.finalize(body, slots.release, key, run=run_id is not None))
        return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)

    return stream, snapshot


def _refusal(e: AgentWorkerError) -> Response:
    status = 404 if isinstance(e, NotFoundError) else \
        403 if isinstance(e, PermissionDeniedError) else 400
    return JSONResponse({"error": {"code": e.code, "message": str(e)}}, status_code=status)


def _session_check(console: Console, request: Request, every: float) -> Callable[[], bool]:
    """Whether the stream's session still holds (not logged out), asked at
    most once per ``every`` seconds (it may ask Redis)."""
    due = [time.monotonic() + every]

    def still_in() -> bool:
        if time.monotonic() < due[0]:
            return True
        due[0] = time.monotonic() + every
        try:
            return console.sessions.visitor(request) is not None
        except AgentWorkerError:
            return False

    return still_in


def _run_feed(aw: AgentWorker, run_id: str, after: int, tick: float, lifetime: float,
              still_in: Callable[[], bool], release: Callable[[], None]) -> Iterator[str]:
    """The run's events as frames, until the run ends, the lifetime passes or
    the session is logged out. Iterated in the server's thread pool."""
    ends = time.monotonic() + lifetime
    feed = follow(aw, run_id, after=after, poll_seconds=tick, idle_ticks=True)

    def bounded() -> Iterator[Any]:
        for event in feed:
            yield event
            if time.monotonic() >= ends or not still_in():
                return

    try:
        yield "retry: 1000\n\n"
        for event in bounded():
            if event is None:
                yield ": keep-alive\n\n"
                continue
            kind = "end" if event.kind == "end" else "run"
            yield f"id: {event.id}\n" + _frame(kind, {"kind": event.kind, "lap": event.lap})
    finally:
        feed.close()
        release()


async def _overview(aw: AgentWorker, ctx: Ctx | None, listing: runs.RunQuery | None,
                    first: dict[str, Any], tick: float, lifetime: float,
                    still_in: Callable[[], bool],
                    release: Callable[[], None]) -> AsyncIterator[str]:
    """``approvals`` and ``runs`` events whenever what they show changed (from
    ``first``, the state read before answering); a keep-alive comment
    otherwise (which also notices a client that left)."""
    ends = time.monotonic() + lifetime
    sent: dict[str, Any] = {}
    now = first
    try:
        yield "retry: 1000\n\n"
        while time.monotonic() < ends:
            changed = [k for k in ("approvals", "runs") if k in now and now[k] != sent.get(k)]
            for kind in changed:
                yield _frame(kind, now[kind])
            sent = now
            if not changed:
                yield ": keep-alive\n\n"
            await anyio.sleep(tick)
            if not await run_in_threadpool(still_in):
                return
            now = await run_in_threadpool(state, aw, ctx, listing)
    finally:
        release()


__all__ = ["HEADERS", "LIFETIME_SECONDS", "PER_SESSION", "RUN_STREAMS", "Gate", "last_event_id",
           "session_key", "state", "stream_routes"]
