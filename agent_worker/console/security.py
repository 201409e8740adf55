"""What the console does for a browser's safety beyond the login: response
headers, the forwarded headers of a trusted proxy, and the secrets it refuses
to start with.

``SecurityHeaders`` wraps the whole app (outside Starlette's own error
middleware), so every response carries the headers: pages, redirects, error
pages (a 500 included), ``/healthz`` and the static files. The pages have no
inline script, style or event handler (``static/console.js`` and
``static/console.css`` are the only ones), so the policy allows nothing but
the console's own origin, and no framing at all.

``forwarded(app, trusted)`` is uvicorn's ``ProxyHeadersMiddleware``: a request
from a trusted proxy takes its scheme from ``X-Forwarded-Proto`` and its client
address from ``X-Forwarded-For``; anybody else's forwarded headers are ignored.
"""

from __future__ import annotations

from typing import Any, cast

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from agent_worker.core.errors import PlaceholderSecretError
from agent_worker.core.settings import Settings
from agent_worker.deploy_checks import check_deploy_secrets, is_placeholder

#: The pages load ``/static/console.js`` and ``/static/console.css`` and fetch
#: ``/runs/<id>/live``; forms post to the console. Nothing else, from nowhere else.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")

HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

#: The shortest session key the console accepts (``secrets.token_urlsafe(32)``
#: is 43 characters).
MIN_SECRET_LENGTH = 32


class SecurityHeaders:
    """ASGI middleware: ``HEADERS`` on every HTTP response (a header the
    response set itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def trusted_proxies(value: str) -> list[str]:
    """``AGENT_WORKER_CONSOLE_TRUSTED_PROXIES`` as a list (blanks dropped)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def forwarded(app: ASGIApp, trusted: list[str]) -> ASGIApp:
    """``app`` believing the forwarded headers of ``trusted`` addresses only
    (uvicorn's own middleware); ``app`` itself when nobody is trusted."""
    if not trusted:
        return app
    # uvicorn types ASGI apps more narrowly than Starlette; the protocol is the same.
    return cast(ASGIApp, ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=trusted))


def check_console_secrets(settings: Settings) -> None:
    """Refuse to serve with a placeholder: the session key (a placeholder such as
    ``changeme`` or ``CHANGE_ME``, or shorter than ``MIN_SECRET_LENGTH``; empty is
    allowed: a random key is generated), and the passwords in the database and
    broker URLs (``deploy_checks``, as every other process does).

    Raises:
        PlaceholderSecretError: naming the setting.
    """
    secret = settings.console_secret
    if secret:
        if is_placeholder(secret):
            raise PlaceholderSecretError(
                "AGENT_WORKER_CONSOLE_SECRET is a placeholder: anyone who reads it can forge "
                "a session cookie; set a random key (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))') or leave it empty for one per start")
        if len(secret) < MIN_SECRET_LENGTH:
            raise PlaceholderSecretError(
                f"AGENT_WORKER_CONSOLE_SECRET is {len(secret)} characters; a session key needs "
                f"at least {MIN_SECRET_LENGTH} (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')")
    check_deploy_secrets(settings, {})


__all__ = ["CONTENT_SECURITY_POLICY", "HEADERS", "MIN_SECRET_LENGTH", "SecurityHeaders",
           "check_console_secrets", "forwarded", "trusted_proxies"]
