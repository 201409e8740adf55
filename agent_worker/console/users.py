"""The console's users: principals from the configuration, with password hashes.

A user is ``{id, tenant, roles, password_hash}`` in ``AGENT_WORKER_CONSOLE_USERS``
(a JSON list, or the path of a file holding one). The hash is scrypt from the
standard library with a random salt (``hash_password``), compared in constant
time; an unknown user costs the same scrypt as a wrong password, so timing does
not tell which user ids exist. What a user may do is not decided here: the
user becomes a ``Principal`` and the API's authorization decides.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_worker.core.errors import ConfigurationError, InvalidInputError
from agent_worker.core.principal import Principal

#: scrypt cost: 16 MiB of memory and ~50 ms per check, the standard library's ceiling
#: being 32 MiB by default.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SCHEME = "scrypt"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32,
                          maxmem=64 * 1024 * 1024)


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    """``scrypt$n$r$p$salt$hash``: what ``agent-worker console hash-password`` prints.
    The cost ``n`` is stored in the hash, so raising it later keeps old hashes valid.

    Raises:
        InvalidInputError: an empty password, or ``n`` not a power of two above 1.
    """
    if not password:
        raise InvalidInputError("a console password must not be empty")
    if n < 2 or n & (n - 1):
        raise InvalidInputError(f"scrypt cost must be a power of two above 1, got {n}")
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, n, SCRYPT_R, SCRYPT_P)
    return f"{SCHEME}${n}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time comparison)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != SCHEME:
            return False
        got = _scrypt(password, _unb64(salt), int(n), int(r), int(p))
        return hmac.compare_digest(got, _unb64(digest))
    except (ValueError, TypeError):
        return False


#: Checked when the user id is unknown, so that case takes as long as a wrong password.
_DECOY = f"{SCHEME}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(b'0' * 16)}${_b64(b'0' * 32)}"


@dataclass(frozen=True)
class ConsoleUser:
    """One configured user; ``password_hash`` is None for a proxy-only user."""

    principal: Principal
    password_hash: str | None

    @property
    def id(self) -> str:
        return self.principal.id


class UserBook:
    """The configured users by id."""

    def __init__(self, users: list[ConsoleUser]) -> None:
        self.users = {u.id: u for u in users}
        if len(self.users) != len(users):
            raise ConfigurationError("AGENT_WORKER_CONSOLE_USERS names a user twice")

    @classmethod
    def parse(cls, value: str) -> UserBook:
        """From the setting: JSON, or the path of a JSON file.

        Raises:
            ConfigurationError: unreadable, or a user that is not a valid principal.
        """
        text = value.strip()
        if text and text[0] not in "[{":
            try:
                text = Path(text).read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigurationError(f"cannot read console users file {value!r}: {e}") from e
        if not text.strip():
            return cls([])
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise ConfigurationError(f"console users are not JSON: {e}") from e
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list):
            raise ConfigurationError("console users must be a JSON list of objects")
        return cls([_user(entry) for entry in raw])

    def get(self, user_id: str) -> ConsoleUser | None:
        return self.users.get(user_id)

    def login(self, user_id: str, password: str) -> ConsoleUser | None:
        """The user, if ``password`` is theirs; None otherwise (also for a
        proxy-only user, who has no password)."""
        user = self.users.get(user_id)
        stored = user.password_hash if user is not None else None
        ok = check_password(password, stored or _DECOY)
        return user if ok and user is not None and stored else None


def _user(entry: Any) -> ConsoleUser:
    if not isinstance(entry, dict):
        raise ConfigurationError("each console user must be a JSON object")
    unknown = set(entry) - {"id", "tenant", "roles", "password_hash"}
    if unknown:
        raise ConfigurationError(f"console user has unknown fields {sorted(unknown)}")
    try:
        principal = Principal(str(entry["id"]), str(entry["tenant"]), entry.get("roles", []))
    except (KeyError, InvalidInputError) as e:
        raise ConfigurationError(f"invalid console user {entry.get('id')!r}: {e}") from e
    pw = entry.get("password_hash")
    if pw is not None and (not isinstance(pw, str) or not pw.startswith(SCHEME + "$")):
        raise ConfigurationError(f"console user {principal.id!r}: password_hash must come "
                                 "from `agent-worker console hash-password`")
    return ConsoleUser(principal, pw)


__all__ = ["ConsoleUser", "UserBook", "check_password", "hash_password"]
