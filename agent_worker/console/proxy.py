"""Single sign-on through a trusted reverse proxy: the user the proxy
authenticated, named in a header.

Kept apart from the session code so that it can be unified with the API's
own principal resolution (``agent_worker.webauth``, issue 16): this is the
whole of the console's trust in a header. It is used only when
``AGENT_WORKER_CONSOLE_PROXY_HEADER`` is set, and the name must be a
configured console user (whose tenant and roles apply): the header can choose
among known users, never invent one.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_worker.console.users import ConsoleUser, UserBook


def proxied_user(headers: Mapping[str, str], header: str, users: UserBook
                 ) -> ConsoleUser | None:
    """The configured user the proxy's ``header`` names; None when the header is
    not configured, absent or names nobody known."""
    if not header:
        return None
    name = headers.get(header.lower(), "").strip()
    return users.get(name) if name else None


__all__ = ["proxied_user"]
