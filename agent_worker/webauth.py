"""Who is calling over HTTP: a ``Principal`` from a request's headers, for the
server-sent events app (``agent_worker.sse``) and the web console, which then
act as it (``AgentWorker.acting_as``): another tenant's run is a 404 there,
exactly as through the API.

Two ways in, each only when configured; anything else is refused (401):

- **Bearer tokens** (``Authorization: Bearer <token>``), for programs and
  dashboards. The configuration (``AGENT_WORKER_WEB_TOKENS``) maps each token's
  SHA-256 digest, never the token, to a principal, so a leaked configuration
  grants nothing. An unsalted fast hash is enough for long random tokens
  (there is no dictionary to try); short or chosen ones would need a slow one.
- **A trusted reverse proxy** that authenticated the user (SSO, OAuth2 Proxy,
  the console's login) and names it in headers
  (``AGENT_WORKER_WEB_PROXY_USER_HEADER`` and the tenant and roles headers).
  A header proves something only when every request comes through that proxy
  and the proxy overwrites the client's own copies: serve the app on loopback
  or a network only the proxy reaches.

A request that presents a bearer token is judged by the token alone: a bad
token is refused even when proxy headers come with it.

``proxy_named`` is the one reading of a proxy's header, shared with the run
console (``console.proxy``), whose proxy names only the id of a configured
user: the two trust the header in the same way and differ only in what the
name is looked up as.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from agent_worker.core.errors import AuthenticationError, ConfigurationError, InvalidInputError
from agent_worker.core.principal import Principal
from agent_worker.core.settings import Settings

_DIGEST_CHARS = frozenset("0123456789abcdef")


def token_digest(token: str) -> str:
    """The SHA-256 hex digest ``AGENT_WORKER_WEB_TOKENS`` keys a token by
    (the same as ``printf %s "$TOKEN" | sha256sum``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_tokens(raw: str) -> dict[str, Principal]:
    """``AGENT_WORKER_WEB_TOKENS`` (JSON: digest -> ``{"id", "tenant", "roles"}``).

    Raises:
        ConfigurationError: not that shape, a key that is not a SHA-256 hex
            digest (a token pasted in plaintext), or a principal that cannot be.
    """
    if not raw.strip():
        return {}
    try:
        entries: Any = json.loads(raw)
        if not isinstance(entries, dict):
            raise ValueError("not a JSON object")
        out: dict[str, Principal] = {}
        for digest, who in entries.items():
            if len(digest) != 64 or not set(digest) <= _DIGEST_CHARS:
                raise ValueError(f"key {digest[:8]!r}... is not a lowercase SHA-256 hex "
                                 "digest (never put a token itself here)")
            if not isinstance(who, dict) or set(who) - {"id", "tenant", "roles"}:
                raise ValueError("each principal is {\"id\", \"tenant\", \"roles\"}")
            out[digest] = Principal(who["id"], who["tenant"], who.get("roles", []))
        return out
    except (ValueError, KeyError, TypeError, InvalidInputError) as e:
        raise ConfigurationError(f"AGENT_WORKER_WEB_TOKENS: {e}") from e


def proxy_named(headers: Mapping[str, str], header: str) -> str | None:
    """What a trusted reverse proxy put in ``header``, stripped; None when no
    header is configured (an empty name: no proxy is trusted), or the request
    has none or a blank one. ``headers`` as Starlette's (case-insensitive) or
    a plain mapping keyed as configured or in lower case."""
    if not header:
        return None
    value = headers.get(header)
    if value is None:
        value = headers.get(header.lower(), "")
    return value.strip() or None


@dataclass(frozen=True)
class ProxyHeaders:
    """The headers a trusted reverse proxy names its authenticated user in."""

    user: str
    tenant: str = "X-Forwarded-Tenant"
    roles: str = "X-Forwarded-Roles"


class WebAuth:
    """Resolves the principal of a web request (see the module docstring)."""

    def __init__(self, *, tokens: Mapping[str, Principal] | None = None,
                 proxy: ProxyHeaders | None = None) -> None:
        self.tokens = dict(tokens or {})
        self.proxy = proxy

    @classmethod
    def from_settings(cls, settings: Settings) -> WebAuth:
        """From ``AGENT_WORKER_WEB_*``. Raises ``ConfigurationError`` (at start,
        not at the first request) on malformed tokens."""
        proxy = None
        if settings.web_proxy_user_header:
            proxy = ProxyHeaders(settings.web_proxy_user_header,
                                 settings.web_proxy_tenant_header,
                                 settings.web_proxy_roles_header)
        return cls(tokens=parse_tokens(settings.web_tokens), proxy=proxy)

    def principal(self, headers: Mapping[str, str]) -> Principal:
        """Who sent a request with ``headers`` (case-insensitive, as Starlette's
        ``request.headers``).

        Raises:
            AuthenticationError: no credentials that this configuration accepts.
        """
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            # Keyed by digest: a lookup's timing can tell only about the digest
            # of what the caller sent, never about a stored token.
            who = self.tokens.get(token_digest(token.strip())) \
                if scheme.lower() == "bearer" else None
            if who is None:
                raise AuthenticationError("unknown bearer token")
            return who
        user = proxy_named(headers, self.proxy.user) if self.proxy is not None else None
        if self.proxy is not None and user is not None:
            return self._from_proxy(headers, self.proxy, user)
        raise AuthenticationError("authentication required")

    @staticmethod
    def _from_proxy(headers: Mapping[str, str], proxy: ProxyHeaders, user: str) -> Principal:
        tenant = proxy_named(headers, proxy.tenant)
        if tenant is None:
            raise AuthenticationError(f"the proxy named a user but no {proxy.tenant}")
        listed = proxy_named(headers, proxy.roles) or ""
        roles = [r.strip() for r in listed.split(",") if r.strip()]
        try:
            return Principal(user, tenant, roles)
        except InvalidInputError as e:
            raise AuthenticationError(f"the proxy's principal is not valid: {e}") from e


def unauthorized(error: AuthenticationError) -> JSONResponse:
    """The 401 for ``error``: JSON like every other error, and the challenge
    header HTTP requires with it."""
    return JSONResponse({"error": {"code": error.code, "message": str(error)}},
                        status_code=401, headers={"WWW-Authenticate": "Bearer"})


__all__ = ["ProxyHeaders", "WebAuth", "parse_tokens", "proxy_named", "token_digest",
           "unauthorized"]
