"""Server-sent events for web clients: ``GET /runs/{run_id}/events``.

A small ASGI app (Starlette: the run console is built on it, and
it streams a plain iterator with no framework of its own around it). Each
event of ``AgentWorker.stream`` goes out as

    id: <event id>
    event: <kind>
    data: <the event as JSON, with the lap's messages>

A browser's ``EventSource`` reconnects by itself and sends the last id it saw
as ``Last-Event-ID``; the stream resumes after it, so a reconnect shows no
event twice and skips none (``?after=<id>`` does the same for clients that
cannot set headers). The stream ends with ``event: end`` once the run has
finished. While nothing happens a comment line goes out every poll interval,
which keeps proxies from closing the connection and lets the server notice a
client that left.

Serve it with any ASGI server, e.g. ``uvicorn --factory
agent_worker.sse:app_from_settings``. Every request authenticates
(``agent_worker.webauth``: a bearer token or a trusted proxy's headers; else
401) and the stream acts as that principal, so a run of another tenant is a
404 like a run nobody has. Each open stream holds one Postgres connection (its
``LISTEN``) and, while it waits, one thread of the server's pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_worker.api import AgentWorker, client
from agent_worker.core.errors import (
    AgentWorkerError,
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
)
from agent_worker.core.settings import get_settings
from agent_worker.streaming import DEFAULT_POLL_SECONDS, StreamEvent, check_after, follow
from agent_worker.webauth import WebAuth, unauthorized


def create_app(worker: AgentWorker | None = None, *, auth: WebAuth | None = None,
               poll_seconds: float = DEFAULT_POLL_SECONDS * 15) -> Starlette:
    """The SSE app over ``worker`` (default: the configured ``client()``),
    acting for each request as the principal ``auth`` resolves (default: from
    ``AGENT_WORKER_WEB_*``; with none configured, every request is a 401)."""
    gate = auth or WebAuth.from_settings(get_settings())

    async def events(request: Request) -> Response:
        try:
            aw = (worker or client()).acting_as(gate.principal(request.headers))
        except AuthenticationError as e:
            return unauthorized(e)
        except AgentWorkerError as e:  # a principal id past max_principal_chars
            return unauthorized(AuthenticationError(str(e)))
        run_id = request.path_params["run_id"]
        raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        try:
            after = check_after(raw)
            aw.get_run(run_id)
        except AgentWorkerError as e:
            status = 404 if isinstance(e, NotFoundError) else \
                403 if isinstance(e, PermissionDeniedError) else 400
            return JSONResponse({"error": {"code": e.code, "message": str(e)}}, status_code=status)
        return StreamingResponse(
            _frames(follow(aw, run_id, after=after, poll_seconds=poll_seconds,
                           idle_ticks=True)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return Starlette(routes=[Route("/runs/{run_id}/events", events)])


def _frames(stream: Iterator[StreamEvent | None]) -> Iterator[str]:
    yield "retry: 1000\n\n"
    try:
        for event in stream:
            if event is None:
                yield ": keep-alive\n\n"
                continue
            data = json.dumps(event.to_json(), default=str, separators=(",", ":"))
            # The kind is ours (no newline can reach it); the data is one JSON line.
            yield f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def app_from_settings() -> Starlette:
    """For ``uvicorn --factory``: the app over the settings' store."""
    return create_app()


__all__ = ["app_from_settings", "create_app"]
