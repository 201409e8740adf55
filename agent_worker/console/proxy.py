"""Single sign-on through a trusted reverse proxy: the user the proxy
authenticated, named in a header.

The header is read by ``webauth.proxy_named``, the web endpoints' own reading
of a proxy's header, so the two trust a header in one way. They
differ, on purpose, in what the name means: the web endpoints take the user's
tenant and roles from the proxy's other headers, while the console takes them
from its configuration: the header is used only when
``AGENT_WORKER_CONSOLE_PROXY_HEADER`` is set, and the name must be a
configured console user: it can choose among known users, never invent one.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_worker.console.users import ConsoleUser, UserBook
from agent_worker.webauth import proxy_named


def proxied_user(headers: Mapping[str, str], header: str, users: UserBook
                 ) -> ConsoleUser | None:
    """The configured user the proxy's ``header`` names; None when the header is
    not configured, absent or names nobody known."""
    name = proxy_named(headers, header)
    return users.get(name) if name else None


__all__ = ["proxied_user"]
