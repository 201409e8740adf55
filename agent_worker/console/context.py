"""The plumbing every console page shares: who asks (``Ctx``), the checks
before a page runs (login, CSRF on POST), and errors turned into pages.

A page is a plain function ``(Ctx) -> Response`` run in the server's thread
pool (the API blocks on the database); ``handler`` wraps it into a Starlette
endpoint. ``ctx.aw`` is ``AgentWorker.acting_as(the visitor's principal)``:
tenant scope, roles and the audit log are the API's, never re-implemented here,
so a forged POST meets the same refusal as a hidden button.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agent_worker.api import AgentWorker
from agent_worker.console.session import CSRF_FIELD, Sessions, Visitor, csrf_ok
from agent_worker.console.throttle import LoginThrottle
from agent_worker.core.errors import (
    AgentWorkerError,
    CsrfRefusedError,
    InvalidInputError,
    NestingTooDeepError,
    NotFoundError,
    PermissionDeniedError,
    SessionCheckError,
)
from agent_worker.core.settings import Settings


@dataclass
class Console:
    """What the app holds for its lifetime: the API handle (acting as nobody
    in particular: every request re-binds it), sessions, templates, settings,
    and the count of failed logins."""

    aw: AgentWorker
    sessions: Sessions
    env: Environment
    settings: Settings
    throttle: LoginThrottle


@dataclass
class Ctx:
    """One request, as a page sees it."""

    console: Console
    request: Request
    visitor: Visitor
    aw: AgentWorker
    form: dict[str, str] = field(default_factory=dict)

    @property
    def query(self) -> Any:
        return self.request.query_params

    def page_link(self, param: str, page: int) -> str:
        """This page's URL with one pager (``param``) moved to ``page``."""
        params = dict(self.query)
        params[param] = str(page)
        params.pop("done", None)
        return f"{self.request.url.path}?{urlencode(params)}"

    def render(self, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        return render(self.console, template, status, visitor=self.visitor, **values)


def render(console: Console, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    """A template with what the layout needs (the header's links, the CSRF token)."""
    visitor: Visitor | None = values.pop("visitor", None)
    # How often a page without the live stream polls (base.html's data-poll).
    values.setdefault("poll_ms", round(console.settings.console_poll_seconds * 1000))
    html = console.env.get_template(template).render(
        flower_url=console.settings.console_flower_url,
        metrics_url=console.settings.console_metrics_url, visitor=visitor,
        csrf_field=CSRF_FIELD, csrf=visitor.csrf if visitor else "", **values)
    return HTMLResponse(html, status_code=status)


Page = Callable[[Ctx], Response]
Endpoint = Callable[[Request], Awaitable[Response]]

#: What an error from the API shows as: (status, heading).
_STATUS: list[tuple[type[AgentWorkerError], int, str]] = [
    (NotFoundError, 404, "Not found"),
    (PermissionDeniedError, 403, "Not allowed"),
    (InvalidInputError, 400, "Refused"),
    (AgentWorkerError, 409, "Not possible now"),
]


def error_page(console: Console, e: AgentWorkerError, visitor: Visitor | None,
               run_id: str | None = None) -> HTMLResponse:
    """The page for ``e``. A 409 about ``run_id`` (the run changed since the
    page was shown: it finished, or someone else acted first) links back to
    the run as it is now."""
    status, heading = next((s, h) for cls, s, h in _STATUS if isinstance(e, cls))
    back = f"/runs/{quote(run_id, safe='')}" if status == 409 and run_id else None
    return render(console, "error.html", status, visitor=visitor, heading=heading,
                  code=e.code, message=str(e), back=back)


def handler(console: Console, page: Page) -> Endpoint:
    """``page`` behind the login (a GET without one goes to the login page,
    a POST without one is refused) and, for a POST, the CSRF check."""

    async def endpoint(request: Request) -> Response:
        visitor = await visitor_of(console, request)
        if isinstance(visitor, Response):
            return visitor
        if visitor is None:
            if request.method == "GET":
                target = request.url.path + (f"?{request.url.query}" if request.url.query
                                             else "")
                return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            return render(console, "error.html", 403, heading="Not logged in",
                          code="console_auth", message="log in first")
        form: dict[str, str] = {}
        if request.method == "POST":
            form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
            if not csrf_ok(visitor, form.get(CSRF_FIELD, "")):
                return error_page(console, CsrfRefusedError(
                    "this form did not come from this console session; reload and retry"),
                    visitor)
        ctx = Ctx(console, request, visitor, console.aw.acting_as(visitor.user.principal), form)
        return await run_in_threadpool(_guarded, page, ctx)

    return endpoint


async def visitor_of(console: Console, request: Request) -> Visitor | Response | None:
    """The request's visitor (None: nobody logged in), or the refusal page when
    the session cannot be checked. In the thread pool: the check may wait on
    Redis (``console.revocation``), which must not stall the event loop."""
    try:
        return await run_in_threadpool(console.sessions.visitor, request)
    except SessionCheckError as e:
        return error_page(console, e, None)


def _guarded(page: Page, ctx: Ctx) -> Response:
    try:
        return page(ctx)
    except AgentWorkerError as e:
        return error_page(ctx.console, e, ctx.visitor, ctx.request.path_params.get("run_id"))


def form_json(raw: str | None, what: str) -> Any:
    """A form field's JSON (None when blank). The field is anyone's bytes: a
    parse error or nesting past the parser's own limit is the visitor's bad
    input (a 400 page), never a 500.

    Raises:
        InvalidInputError: not JSON; NestingTooDeepError: nested too deeply.
    """
    text = (raw or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidInputError(f"{what} is not JSON: {e}") from e
    except RecursionError as e:
        raise NestingTooDeepError(f"{what} nests too deeply") from e


__all__ = ["Console", "Ctx", "Endpoint", "Page", "error_page", "form_json", "handler", "render",
           "visitor_of"]
