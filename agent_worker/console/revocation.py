"""Logged-out sessions, remembered server-side until their cookies would have
expired anyway.

A session cookie is signed, not stored: deleting it at logout leaves any copy
(a stolen one) valid for the rest of its ``console_session_hours``. So a
logout revokes the session's nonce here, and every request checks it.

**Where: Redis, the broker every console process already reaches**, one key
per revoked session (``agent-worker:console:revoked:<nonce>``) expiring with
the session's own lifetime, so the list cleans itself. Several console
replicas behind a load balancer share it (process memory would revoke the
cookie on one replica only). Not Postgres: it has no table for this and the
console takes no migration; a key with a TTL needs no sweeper. What that costs:
a Redis that loses its data (no AOF) forgets revocations, and a stolen cookie
lives out its natural lifetime again, no worse than before this module. A
Redis that cannot be reached fails closed (``SessionCheckError``): an
unchecked session is refused, never trusted.

**What a logout ends: that session** (the nonce of that login, in every copy
of its cookie); the same user's other sessions (another browser) stay, as a
logout on a shared screen should not end the user's session on their own
laptop. To end every session of a user, remove the user from
``AGENT_WORKER_CONSOLE_USERS`` and restart the consoles; to end everyone's,
change ``AGENT_WORKER_CONSOLE_SECRET``.

An in-process worker has no broker and is one process by construction: its
console keeps revocations in memory (``MemoryRevocations``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import redis

from agent_worker.core.errors import ConfigurationError, SessionCheckError

log = logging.getLogger(__name__)

PREFIX = "agent-worker:console:revoked:"
#: Short: a request waits this long at most for Redis before it is refused.
REDIS_TIMEOUT_SECONDS = 2.0


class Revocations(Protocol):
    """Where logged-out sessions are remembered."""

    def revoke(self, nonce: str, ttl_seconds: int) -> None:
        """Refuse ``nonce``'s session from now on (for ``ttl_seconds`` at least)."""

    def revoked(self, nonce: str) -> bool:
        """Whether ``nonce``'s session was logged out."""


class RedisRevocations:
    """Revocations shared by every console process on one Redis."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"the console keeps logged-out sessions in Redis; the broker URL is not "
                f"Redis ({url.split(':', 1)[0]}://...)")
        self._redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS)

    def revoke(self, nonce: str, ttl_seconds: int) -> None:
        try:
            self._redis.set(PREFIX + nonce, b"1", ex=max(1, ttl_seconds))
        except redis.RedisError as e:
            log.warning("console logout not recorded: %s", e)
            # The page says what failed, never where Redis is (no URL is rendered).
            raise SessionCheckError("the logout could not be recorded (the session store "
                                    "is unreachable): the session stays valid until it "
                                    "expires; log out again shortly") from e

    def revoked(self, nonce: str) -> bool:
        try:
            return bool(self._redis.exists(PREFIX + nonce))
        except redis.RedisError as e:
            log.warning("console session not checked: %s", e)
            raise SessionCheckError("cannot check whether this session was logged out (the "
                                    "session store is unreachable); try again shortly") from e

    def close(self) -> None:
        self._redis.close()


class MemoryRevocations:
    """Revocations of one process (an in-process worker's console, tests)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def revoke(self, nonce: str, ttl_seconds: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._until = {n: t for n, t in self._until.items() if t > now}
            self._until[nonce] = now + max(1, ttl_seconds)

    def revoked(self, nonce: str) -> bool:
        with self._lock:
            return self._until.get(nonce, 0.0) > time.monotonic()


__all__ = ["PREFIX", "MemoryRevocations", "RedisRevocations", "Revocations"]
