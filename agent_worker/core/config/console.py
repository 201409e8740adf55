"""Settings of the run console (``agent_worker.console``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class ConsoleSettings(BaseSettings):
    """The run console's address, users, sessions and pages."""

    console_bind: str = Field(
        "127.0.0.1", description="Run console: the address it listens on (`--host` overrides)."
    )
    console_port: int = Field(
        8090, description="Run console: the port it listens on (`--port` overrides)."
    )
    console_users: str = Field(
        "",
        description="Run console: its users, as a JSON list (or the path of a JSON file) of "
        "`{id, tenant, roles, password_hash}`; hashes from `agent-worker console "
        "hash-password`. Empty: nobody can log in with a password.",
    )
    console_secret: str = Field(
        "",
        description="Run console: the key that signs session cookies, at least 32 characters "
        "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`); a placeholder "
        "(`changeme`, `CHANGE_ME`, ...) or a shorter key is refused at start. Empty: one is "
        "generated at start, so a restart logs everybody out (set it when several console "
        "processes serve one address).",
    )
    console_session_hours: float = Field(
        12.0, gt=0, description="Run console: how long a login lasts."
    )
    console_proxy_header: str = Field(
        "",
        description="Run console: the header a trusted reverse proxy sets to the id of the "
        "user it authenticated (single sign-on); the user must be in `CONSOLE_USERS`. Empty: "
        "off. Set it only when nothing but the proxy can reach the console.",
    )
    console_trusted_proxies: str = Field(
        "",
        description="Run console: the addresses (comma-separated IPs or networks, e.g. "
        "`10.0.0.5,10.1.0.0/16`) of the TLS-terminating reverse proxies whose "
        "`X-Forwarded-Proto` and `X-Forwarded-For` it believes: a request from one is "
        "taken as HTTPS (so the session cookie is `Secure`) and as coming from the address "
        "the proxy names (login throttling). Empty: no forwarded header is believed.",
    )
    console_login_user_failures: int = Field(
        5, ge=1,
        description="Run console: failed logins to one user name within "
        "`CONSOLE_LOGIN_WINDOW_SECONDS` after which its logins are refused (429) until the "
        "window passes; a successful login resets it. Counted per console process.",
    )
    console_login_address_failures: int = Field(
        20, ge=1,
        description="Run console: failed logins from one client address within "
        "`CONSOLE_LOGIN_WINDOW_SECONDS` after which its logins are refused (429) until the "
        "window passes. Counted per console process.",
    )
    console_login_window_seconds: float = Field(
        300.0, gt=0,
        description="Run console: the sliding window over which failed logins are counted.",
    )
    console_flower_url: str = Field(
        "http://127.0.0.1:5555",
        description="Run console: Flower's address, linked from the header and from each run.",
    )
    console_metrics_url: str = Field(
        "",
        description="Run console: the metrics address linked from the header (e.g. "
        "`http://127.0.0.1:9100/metrics`, where `agent-worker metrics` serves). Empty: no "
        "link.",
    )
    console_currency: str = Field(
        "USD", pattern=r"^[A-Z]{3}$",
        description="Run console: the currency of the agents' price tables (an ISO 4217 "
        "code), shown with every cost.",
    )
    console_page_size: int = Field(
        50, ge=1, le=1000, description="Run console: rows per page of every long list."
    )
    console_poll_seconds: float = Field(
        2.0, gt=0, description="Run console: how often the live stream re-reads the approvals "
        "and the run list a page shows, and how often a page without the stream polls."
    )


__all__ = ["ConsoleSettings"]
