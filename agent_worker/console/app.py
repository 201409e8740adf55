"""The console's ASGI app: routes, templates, static files.

``create_app(worker)`` is what tests and ``agent-worker console`` serve. The
Jinja environment escapes everything (``autoescape=True`` for every template,
whatever its name): model and tool text is data, never markup. Every response
carries the security headers, and only the configured proxies' forwarded
headers are believed (``console.security``); the app refuses to be built with a
placeholder secret. ``/stream`` is the pages' live feed (``console.stream``).
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from agent_worker.api import AgentWorker, client
from agent_worker.console import actions, approvals, run
from agent_worker.console.auth import login_page, logout_page
from agent_worker.console.context import Console, Page, handler
from agent_worker.console.revocation import MemoryRevocations, RedisRevocations, Revocations
from agent_worker.console.runs import runs_page
from agent_worker.console.security import (
    SecurityHeaders,
    check_console_secrets,
    forwarded,
    trusted_proxies,
)
from agent_worker.console.session import Sessions
from agent_worker.console.stream import LIFETIME_SECONDS, Gate, stream_routes
from agent_worker.console.throttle import LoginThrottle
from agent_worker.console.users import UserBook
from agent_worker.console.views import FILTERS
from agent_worker.core.settings import Settings, get_settings
from agent_worker.inprocess import InProcessWorker

HERE = Path(__file__).parent


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(FILTERS)
    return env


class ConsoleApp(Starlette):
    """Starlette with two layers outside its own middleware, error handling
    included (a 500 carries the headers too): outermost the trusted proxies'
    forwarded headers, then the security headers."""

    def __init__(self, routes: list[BaseRoute], trusted: list[str]) -> None:
        super().__init__(routes=routes)
        self.trusted = trusted

    def build_middleware_stack(self) -> ASGIApp:
        return forwarded(SecurityHeaders(super().build_middleware_stack()), self.trusted)


def create_app(worker: AgentWorker | None = None, *, settings: Settings | None = None,
               users: UserBook | None = None,
               revocations: Revocations | None = None,
               throttle: LoginThrottle | None = None,
               stream_seconds: float = LIFETIME_SECONDS,
               streams: Gate | None = None) -> Starlette:
    """The console over ``worker`` (default: the configured ``client()``), its
    users from ``users`` or ``AGENT_WORKER_CONSOLE_USERS``, logged-out
    sessions in ``revocations`` (default: ``revocations_for(worker)``), failed
    logins counted by ``throttle`` (default: the settings' limits); each live
    stream lasts ``stream_seconds`` before the browser reconnects, and
    ``streams`` caps how many are open (default: ``console.stream``'s limits).

    Raises:
        PlaceholderSecretError: the session key, or the password of the
            database or broker URL, is a placeholder (``check_console_secrets``).
    """
    if worker is None:  # refused before connecting to anything
        check_console_secrets(settings or get_settings())
    aw = worker or client()
    s = settings or aw.rt.settings
    check_console_secrets(s)
    book = users if users is not None else UserBook.parse(s.console_users)
    sessions = Sessions(book, secret=s.console_secret,
                        max_age_seconds=s.console_session_hours * 3600,
                        proxy_header=s.console_proxy_header,
                        revocations=revocations or revocations_for(aw, s))
    throttle = throttle or LoginThrottle(per_user=s.console_login_user_failures,
                                         per_address=s.console_login_address_failures,
                                         window_seconds=s.console_login_window_seconds)
    console = Console(aw=aw, sessions=sessions, env=environment(), settings=s,
                      throttle=throttle)

    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def favicon(request: Request) -> Response:
        # Where browsers look when a page names no icon (the pages name /static/favicon.svg).
        return FileResponse(HERE / "static" / "favicon.ico", media_type="image/x-icon")

    def page(path: str, fn: Page, methods: list[str] | None = None) -> Route:
        return Route(path, handler(console, fn), methods=methods or ["GET"])

    live, live_state = stream_routes(console, lifetime=stream_seconds, gate=streams)

    routes: list[BaseRoute] = [
        Route("/", home), Route("/healthz", healthz), Route("/favicon.ico", favicon),
        Route("/login", login_page(console), methods=["GET", "POST"]),
        Route("/logout", logout_page(console), methods=["POST"]),
        page("/runs", runs_page),
        Route("/stream", live), Route("/stream/state", live_state),
        page("/runs/{run_id}", run.run_page),
        page("/runs/{run_id}/live", run.live_fragment),
        page("/approvals", approvals.inbox),
        page("/approvals/{approval_id}/decide", approvals.decide, ["POST"]),
        page("/runs/{run_id}/actions/{verb}", actions.confirm),
        page("/runs/{run_id}/actions/{verb}", actions.act, ["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return ConsoleApp(routes, trusted_proxies(s.console_trusted_proxies))


def revocations_for(aw: AgentWorker, settings: Settings) -> Revocations:
    """Where the console remembers logged-out sessions: the broker's Redis,
    which every console process of a fleet shares; an in-process worker has no
    broker and is one process, so its console remembers them in memory.

    Raises:
        ConfigurationError: the broker is not Redis.
    """
    if isinstance(aw, InProcessWorker):
        return MemoryRevocations()
    return RedisRevocations(settings.broker_url)


def app_from_settings() -> Starlette:
    """For ``uvicorn --factory``: the console over the settings' store and broker."""
    return create_app(settings=get_settings())


__all__ = ["ConsoleApp", "app_from_settings", "create_app", "environment", "revocations_for"]
