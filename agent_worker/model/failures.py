"""One classification of provider failures, shared by every SDK-backed model client.

Why one place: the lap engine reacts to a failed model call by the error's class alone
(retry the lap later, compact the window, fail the run), so an HTTP 429 or a dropped
connection must mean the same thing whichever provider produced it, and no message we
raise may carry the API key (error messages end up on run rows and in logs).

Retries *inside* one call are left to the official SDKs. Read in the installed sources
(openai 3.57 and anthropic 2.14, ``_base_client.py``: ``_should_retry``,
``_calculate_retry_timeout``, ``_parse_retry_after_header``, ``_request``):

* both retry connection errors, timeouts and HTTP 408, 409, 429 and 5xx, at most
  ``max_retries`` times, then raise; the request (our ``Idempotency-Key`` header included)
  is rebuilt from the same options on every attempt;
* before a retry both sleep for the server's ``retry-after-ms`` (milliseconds) or
  ``retry-after`` (seconds, or an HTTP date) when it is present and positive, and
  otherwise back off exponentially: 0.5 s * 2**n, at most 8 s, minus up to 25 % jitter;
* a response header ``x-should-retry: true|false`` overrides the status-code rule;
* openai refuses to retry when Retry-After exceeds 120 s; anthropic would sleep for any
  value, an infinite one included (up to ~49 days).

So the SDKs honour Retry-After and bound the number of attempts, but not the time one
call may hold a worker. :func:`retry_after_guard` closes that gap the same way for both:
a response asking for a longer wait than the client's ``max_retry_after`` is marked
``x-should-retry: false``, the SDK raises at once, and :class:`RateLimitedError` carries
the requested wait to the engine, which can schedule the lap again instead of sleeping.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agent_worker.core.errors import (
    ContextLengthError,
    MalformedModelOutputError,
    ModelError,
    TransientModelError,
)

if TYPE_CHECKING:
    import httpx2

#: Statuses the SDKs retry themselves; still failing afterwards means "try the lap later".
_TRANSIENT_STATUSES = frozenset({408, 409, 429})

#: How providers (OpenAI, Anthropic, vLLM, LiteLLM, Ollama) word "your prompt is too long".
_CONTEXT_LENGTH = re.compile(
    r"context.length|context.window|maximum context|prompt is too long|too many tokens",
    re.IGNORECASE,
)

_DETAIL_LIMIT = 500


class RateLimitedError(TransientModelError):
    """Raised when the provider still answers 429 after the SDK's retries.

    ``retry_after`` is the wait the provider asked for, in seconds, when it said; the
    engine may use it as the lap's retry delay.
    """

    code = "model_rate_limited"

    def __init__(self, message: str, *, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _HasHeaders(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...


class StatusError(Protocol):
    """What both SDKs' ``APIStatusError`` offer: an HTTP status, its response and body."""

    @property
    def status_code(self) -> int: ...

    @property
    def response(self) -> _HasHeaders: ...

    @property
    def body(self) -> object: ...


@dataclass(frozen=True)
class ProviderFailures:
    """The exception classes one SDK raises, so the shared mapping needs neither SDK.

    ``api_error`` is the SDK's base of everything a call raises; ``status_error`` and
    ``connection_error`` (timeouts included) are its subclasses.
    """

    provider: str
    api_error: type[Exception]
    status_error: type[StatusError]
    connection_error: type[Exception]


def _asked_wait(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for, read as the SDKs read it: ``retry-after-ms``,
    then ``retry-after`` as seconds, then as an HTTP date; ``None`` when it asks
    none. Possibly negative or not finite (``inf``, ``1e309``, ``nan``): the
    Anthropic SDK sleeps for an infinite wait as for a long one (49 days)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) / scale
            except ValueError:
                continue
    parsed = email.utils.parsedate_tz(headers.get("retry-after") or "")
    if parsed is None:
        return None
    try:
        return email.utils.mktime_tz(parsed) - time.time()
    except (OverflowError, ValueError, OSError):  # a year past what the platform holds
        return None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for, at least 0; ``None`` when it asks none we
    can honour (none, or not a finite number): the engine then backs off."""
    seconds = _asked_wait(headers)
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def retry_after_guard(max_wait: float) -> Callable[[httpx2.Response], None]:
    """An httpx response hook that stops the SDK from sleeping longer than
    ``max_wait``. A wait that is not a finite number counts as too long."""

    def guard(response: httpx2.Response) -> None:
        wait = _asked_wait(response.headers)
        if wait is not None and not wait <= max_wait:  # NaN compares false
            response.headers["x-should-retry"] = "false"

    return guard


def translate_failure(
    err: Exception, kinds: ProviderFailures, *, secret: str | None, key_source: str
) -> ModelError:
    """The ``ModelError`` subclass the engine should see for an SDK exception.

    Raise it outside the ``except`` block that caught ``err``, so it neither chains nor
    carries ``err`` as context: the SDK exception holds the provider's raw text and the
    request with our headers. Whatever we quote is scrubbed of ``secret``.
    """

    def redact(text: str) -> str:
        return text.replace(secret, "[redacted]") if secret else text

    provider = kinds.provider
    if isinstance(err, kinds.connection_error):
        cause = err.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
        return TransientModelError(
            redact(f"{provider}: no response after the SDK's retries ({detail})")
        )
    if not isinstance(err, kinds.status_error):
        return MalformedModelOutputError(redact(f"{provider}: unreadable response: {err}"))

    status = err.status_code
    headers = err.response.headers
    code, detail = _provider_detail(err.body)
    request_id = headers.get("request-id") or headers.get("x-request-id")
    where = " ".join(
        part
        for part in (
            f"{provider}: HTTP {status}",
            code,
            f"(request {request_id})" if request_id else None,
        )
        if part
    )
    if status == 429:
        return RateLimitedError(
            redact(f"{where}: rate limited after the SDK's retries: {detail}"),
            retry_after=retry_after_seconds(headers),
        )
    if status in _TRANSIENT_STATUSES or status >= 500:
        return TransientModelError(redact(f"{where}: {detail}"))
    if status in (400, 413) and (
        code == "context_length_exceeded" or _CONTEXT_LENGTH.search(detail)
    ):
        return ContextLengthError(redact(f"{where}: {detail}"))
    if status in (401, 403):
        # Providers echo (parts of) a rejected key in the detail: do not quote it at all.
        return ModelError(f"{where}: the provider rejected the API key from {key_source}")
    return ModelError(redact(f"{where}: {detail}"))


def _provider_detail(body: object) -> tuple[str | None, str]:
    """``(code, message)`` from an OpenAI- or Anthropic-shaped error body."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        message = error.get("message")
        return (
            str(code) if code else None,
            str(message)[:_DETAIL_LIMIT] if message else str(error)[:_DETAIL_LIMIT],
        )
    return None, str(error)[:_DETAIL_LIMIT] if error else "no details"
