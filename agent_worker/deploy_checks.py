"""Refuse to start with a placeholder password.

The deploy examples ship ``CHANGE_ME`` where a secret goes; a copy deployed as is
would guard Postgres, Redis or Flower (whose HTTP API can enqueue tasks and shut
workers down) with a password anyone can read in this repository. Every process
that holds such a password checks it at start: the Celery app (worker, beat and
Flower all load it), ``agent-worker metrics``, and the systemd Flower unit
(``python -m agent_worker.deploy_checks`` in its ``ExecStartPre``).

A URL without a password (``postgresql://app@host/db``: peer auth, a passfile, a
client certificate) is not checked; an empty one (``app:@host``) is refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from agent_worker.core.errors import PlaceholderSecretError
from agent_worker.core.settings import Settings, get_settings

PLACEHOLDERS = frozenset({
    "", "change_me", "changeme", "change-me", "password", "passwd", "secret", "demo",
    "admin", "example", "placeholder", "default", "xxx", "todo", "redis",
    "postgres", "agent_worker",
})


def is_placeholder(password: str) -> bool:
    """True for an empty password, a well-known placeholder, or one containing
    ``CHANGE_ME`` / ``changeme`` (``CHANGE_ME_TOO`` included), case-insensitively."""
    folded = password.strip().lower()
    return folded in PLACEHOLDERS or "change_me" in folded or "changeme" in folded


def check_password(password: str | None, what: str) -> None:
    """Raise ``PlaceholderSecretError`` naming ``what`` if ``password`` is a placeholder;
    ``None`` (no password configured) passes."""
    if password is not None and is_placeholder(password):
        raise PlaceholderSecretError(
            f"{what} has an empty or placeholder password; set a real secret "
            "(for example: python -c 'import secrets; print(secrets.token_urlsafe(24))')")


def url_password(url: str) -> str | None:
    """The password in ``url``, ``None`` when it carries none."""
    netloc = urlsplit(url).netloc
    userinfo, at, _host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return None
    return unquote(userinfo.split(":", 1)[1])


def check_basic_auth(value: str, what: str = "FLOWER_BASIC_AUTH") -> None:
    """``user:password[,user2:password2]`` (Flower's format): every password real."""
    for pair in value.split(","):
        user, colon, password = pair.partition(":")
        check_password(password if colon else "", f"{what} (user {user.strip()!r})")


def check_deploy_secrets(settings: Settings, environ: Mapping[str, str]) -> None:
    """Every password this process was configured with, refused if a placeholder."""
    check_password(url_password(settings.database_url), "AGENT_WORKER_DATABASE_URL")
    check_password(url_password(settings.broker_url), "AGENT_WORKER_BROKER_URL")
    if settings.system_database_url:
        check_password(url_password(settings.system_database_url),
                       "AGENT_WORKER_SYSTEM_DATABASE_URL")
    if "FLOWER_BASIC_AUTH" in environ:
        check_basic_auth(environ["FLOWER_BASIC_AUTH"])


def main() -> int:
    """``python -m agent_worker.deploy_checks``: exit 1 with the reason on a placeholder."""
    try:
        check_deploy_secrets(get_settings(), os.environ)
    except PlaceholderSecretError as e:
        print(f"refusing to start: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["check_basic_auth", "check_deploy_secrets", "check_password", "is_placeholder",
           "url_password"]

if __name__ == "__main__":
    raise SystemExit(main())
