"""Who is at the browser: the signed session cookie, its CSRF token, and the
optional trusted proxy header.

The session is a cookie signed with itsdangerous (no table, no migration):
``{"u": user id, "n": nonce}``, HttpOnly, SameSite=Lax, ``Secure`` when the
request came over HTTPS (directly, or through a trusted proxy's
``X-Forwarded-Proto``: ``console.security``), expiring after
``console_session_hours``. It holds no role and no tenant: those are read from
the configured user on every request, so removing a user or a role takes
effect at once. The CSRF token is an HMAC of the session's nonce: a page can
put it in every form, a cross-site page cannot know it, and a new login (new
nonce) gets a new one. A logout revokes the nonce server-side
(``console.revocation``), so a copy of the cookie dies with the session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from agent_worker.console.proxy import proxied_user
from agent_worker.console.revocation import MemoryRevocations, Revocations
from agent_worker.console.users import ConsoleUser, UserBook

SESSION_COOKIE = "aw_console"
#: A login form's own CSRF token lives in this short cookie until the login.
LOGIN_COOKIE = "aw_console_login"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class Visitor:
    """An authenticated user and the CSRF token their forms must carry."""

    user: ConsoleUser
    csrf: str
    via_proxy: bool = False
    #: The session's nonce (what a logout revokes); None for the proxy's visitor.
    nonce: str | None = None


class Sessions:
    """Issues and reads session cookies; resolves the visitor of a request."""

    def __init__(self, users: UserBook, *, secret: str, max_age_seconds: float,
                 proxy_header: str = "", secure: bool = False,
                 revocations: Revocations | None = None) -> None:
        self.users = users
        self.revocations: Revocations = revocations or MemoryRevocations()
        self._key = (secret or secrets.token_urlsafe(32)).encode()
        self._signer = URLSafeTimedSerializer(self._key, salt="agent-worker-console")
        self.max_age = int(max_age_seconds)
        self.proxy_header = proxy_header.strip().lower()
        self.secure = secure

    def csrf_for(self, nonce: str) -> str:
        return hmac.new(self._key, f"csrf:{nonce}".encode(), hashlib.sha256).hexdigest()

    def visitor(self, request: Request) -> Visitor | None:
        """The proxy's user when the header is configured and present
        (``console.proxy``), else the session cookie's; None when neither names
        a configured user, or the cookie's session was logged out.

        Raises:
            SessionCheckError: whether it was logged out cannot be checked.
        """
        proxied = proxied_user(request.headers, self.proxy_header, self.users)
        if proxied is not None:
            return Visitor(proxied, self.csrf_for(f"proxy:{proxied.id}"), via_proxy=True)
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data = self._signer.loads(raw, max_age=self.max_age)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        user = self.users.get(str(data.get("u")))
        nonce = str(data.get("n"))
        if user is None or self.revocations.revoked(nonce):
            return None
        return Visitor(user, self.csrf_for(nonce), nonce=nonce)

    def start(self, response: Response, user: ConsoleUser, *, https: bool = False) -> None:
        """Log ``user`` in on ``response`` (a fresh nonce, so a fresh CSRF token).
        Over HTTPS the cookie is ``Secure``: never sent back over plain HTTP."""
        token = self._signer.dumps({"u": user.id, "n": secrets.token_urlsafe(16)})
        response.set_cookie(SESSION_COOKIE, token, max_age=self.max_age, httponly=True,
                            samesite="lax", secure=self.secure or https)
        response.delete_cookie(LOGIN_COOKIE)

    def end(self, response: Response, visitor: Visitor | None = None) -> None:
        """Log out: ``visitor``'s session is revoked for every console process
        (for as long as its cookie could live), then the cookie is deleted.

        Raises:
            SessionCheckError: the revocation could not be recorded (the cookie
                is deleted all the same).
        """
        response.delete_cookie(SESSION_COOKIE)
        if visitor is not None and visitor.nonce is not None:
            self.revocations.revoke(visitor.nonce, self.max_age)

    def login_token(self, request: Request) -> str:
        """The login form's CSRF token: the one in the login cookie if valid, else new."""
        raw = request.cookies.get(LOGIN_COOKIE, "")
        return raw if self._valid_login_token(raw) else self._signer.dumps(
            {"l": secrets.token_urlsafe(16)})

    def _valid_login_token(self, raw: str) -> bool:
        try:
            self._signer.loads(raw, max_age=3600)
        except BadSignature:
            return False
        return True

    def remember_login_token(self, response: Response, token: str, *,
                             https: bool = False) -> None:
        response.set_cookie(LOGIN_COOKIE, token, max_age=3600, httponly=True,
                            samesite="lax", secure=self.secure or https)

    def login_token_ok(self, request: Request, sent: str) -> bool:
        """Double submit: the form's token equals the cookie's, and we signed it."""
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        return bool(sent) and hmac.compare_digest(cookie, sent) and self._valid_login_token(
            sent)


def csrf_ok(visitor: Visitor, sent: str) -> bool:
    """Whether a POST carries the visitor's token (constant-time)."""
    return bool(sent) and hmac.compare_digest(visitor.csrf, sent)


__all__ = ["CSRF_FIELD", "LOGIN_COOKIE", "SESSION_COOKIE", "Sessions", "Visitor", "csrf_ok"]
