"""Logging in and out of the console.

The login form has its own CSRF token (double submit: a signed cookie and a
hidden field that must match), so a cross-site page cannot log a browser into
an account of the attacker's choosing. ``next`` only ever names a path of this
console: an absolute URL is ignored, so the login cannot be used to bounce a
user to another site. Failed logins are counted per user name and per client
address (``console.throttle``): past the limits a login is refused with 429 and
``Retry-After`` before its password is even checked.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from agent_worker.console.context import Console, Endpoint, error_page, render, visitor_of
from agent_worker.console.session import CSRF_FIELD, csrf_ok
from agent_worker.core.errors import SessionCheckError


def safe_next(value: str | None) -> str:
    """A local path to go to after the login; anything else is the runs page."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/runs"


def login_page(console: Console) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        sessions = console.sessions
        if request.method == "GET":
            known = await visitor_of(console, request)
            if isinstance(known, Response):
                return known
            if known is not None:
                return RedirectResponse(safe_next(request.query_params.get("next")), 303)
            token = sessions.login_token(request)
            response = render(console, "login.html", next=safe_next(
                request.query_params.get("next")), login_csrf=token, error=None)
            sessions.remember_login_token(response, token, https=request.url.scheme == "https")
            return response
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        target = safe_next(form.get("next"))
        if not sessions.login_token_ok(request, form.get(CSRF_FIELD, "")):
            return _again(console, request, target, "The login form expired; try again.", 403)
        name, address = form.get("username", ""), client_address(request)
        wait = console.throttle.retry_after(name, address)
        if wait:
            refused = _again(console, request, target, "Too many failed logins; try again "
                             f"in {wait} seconds.", 429)
            refused.headers["Retry-After"] = str(wait)
            return refused
        user = await run_in_threadpool(sessions.users.login, name, form.get("password", ""))
        if user is None:
            console.throttle.failed(name, address)
            return _again(console, request, target, "Unknown user or wrong password.", 401)
        console.throttle.succeeded(name)
        done = RedirectResponse(target, status_code=303)
        sessions.start(done, user, https=request.url.scheme == "https")
        return done

    return endpoint


def client_address(request: Request) -> str:
    """The address a login comes from: the connection's peer, or the client a
    trusted proxy names (``console.security.forwarded`` already put it there)."""
    return request.client.host if request.client else "unknown"


def _again(console: Console, request: Request, target: str, error: str, status: int
           ) -> Response:
    token = console.sessions.login_token(request)
    response = render(console, "login.html", status, next=target, login_csrf=token,
                      error=error)
    console.sessions.remember_login_token(response, token,
                                          https=request.url.scheme == "https")
    return response


def logout_page(console: Console) -> Endpoint:
    """POST only (a link could be followed by a cross-site image); needs the CSRF
    token. Revokes the session server-side (``console.revocation``): a copy of
    the cookie taken before is refused after."""

    async def endpoint(request: Request) -> Response:
        visitor = await visitor_of(console, request)
        if isinstance(visitor, Response):
            return visitor
        form = await request.form()
        sent = form.get(CSRF_FIELD)
        response = RedirectResponse("/login", status_code=303)
        if visitor is not None and isinstance(sent, str) and csrf_ok(visitor, sent):
            try:
                await run_in_threadpool(console.sessions.end, response, visitor)
            except SessionCheckError as e:
                # Not revoked: say so (this browser's cookie goes all the same).
                failed = error_page(console, e, None)
                console.sessions.end(failed)
                return failed
            return response
        return render(console, "error.html", 403, visitor=visitor, heading="Not allowed",
                      code="csrf_refused", message="log out from the console's own button")

    return endpoint


__all__ = ["client_address", "login_page", "logout_page", "safe_next"]
