"""What every SDK-backed model client shares: key handling, lazy SDK, failures, parsing.

Why a base class: the two provider clients differ only in the wire mapping. Reading the
key, keeping it out of reprs and pickles, building the SDK client on first use, bounding
retries and translating failures must behave identically, so they live here once.

Keys are read only from the environment or a secrets file, at the first call, and are
held only by the SDK client object, which is never pickled: a client may be constructed
from configuration anywhere (even inside a Celery message) without carrying the key.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import ssl
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_worker.core.errors import MalformedModelOutputError, ModelError
from agent_worker.core.messages import ModelRequest, ModelResponse
from agent_worker.model.failures import ProviderFailures, retry_after_guard, translate_failure

if TYPE_CHECKING:
    import httpx2


class _Closable(Protocol):
    def close(self) -> None: ...


SdkT = TypeVar("SdkT", bound=_Closable)

ResponseHook = Callable[["httpx2.Response"], None]


#: SDK clients (each with its own connection pool) one model client spreads
#: its threads over, a thread keeping to one. Why: the HTTP library's pool
#: scans every connection it holds to place each request, and again when each
#: answer is read: with a threads worker's hundreds of calls in one pool, those
#: two scans took about 15% of the worker's CPU, 7.6% with 16 pools of about
#: 17 threads each (BENCHMARKS.md, "Lap commits no longer queue behind
#: NOTIFY"). With 64 (about 4 threads a pool at 275 laps at once) a worker
#: spent 4.02-4.18 against 4.23 ms of CPU a lap, ahead in 5 of 6 pairs
#: ("The model call without the SDK's typed layer"); the clients share one
#: TLS context (``_tls_context``), so each costs about 4 KB. A process of one
#: thread (prefork, solo) builds one.
SDK_SHARDS = 64


def kept_alive(default: Any) -> Any:
    """The SDK's connection limits (``default``, its ``DEFAULT_CONNECTION_LIMITS``)
    with every connection it may open kept alive, not 100 of its 1,000.

    Why: one client serves every lap of a worker process, and a threads
    worker runs hundreds of model calls at once. Past the hundredth at once,
    each call's connection was closed after its answer and a new one opened
    for the next: a TCP handshake, and a TLS one for a real provider
    (``tests/unit/test_model_connections.py``). Idle connections still close
    after the SDK's ``keepalive_expiry``. Built from the SDK's own ``Limits``
    class, whichever HTTP library the installed SDK uses."""
    return type(default)(max_connections=default.max_connections,
                         max_keepalive_connections=default.max_connections,
                         keepalive_expiry=default.keepalive_expiry)


class SdkModel(ABC, Generic[SdkT]):
    """Base of the provider clients; subclasses build their SDK and map one call.

    ``name`` is ``"<provider>:<model>"``. ``max_retries`` bounds the SDK's own retries
    of one call; ``max_retry_after`` bounds how long one retry may wait on a
    ``Retry-After`` (longer waits are handed to the engine, see ``failures``).
    """

    provider: ClassVar[str]
    failures: ClassVar[ProviderFailures]
    default_key_env: ClassVar[str]
    default_max_output_tokens: ClassVar[int | None] = None

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        api_key_file: str | Path | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        max_output_tokens: int | None = None,
        max_retry_after: float = 60.0,
    ) -> None:
        """``api_key_env`` names the variable holding the key (the provider's
        usual one by default); ``api_key_file`` (a secrets file) wins over it."""
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.base_url = base_url
        self.api_key_env = api_key_env or self.default_key_env
        self.api_key_file = Path(api_key_file) if api_key_file is not None else None
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_output_tokens = (max_output_tokens if max_output_tokens is not None
                                  else self.default_max_output_tokens)
        self.max_retry_after = max_retry_after
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._lock = threading.Lock()
        self._sdks: list[SdkT | None] = [None] * SDK_SHARDS
        self._tls: ssl.SSLContext | None = None
        self._secret: str | None = None
        self._thread_shard = threading.local()
        self._shards_given = itertools.count()

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the assistant's next turn; failures are ``ModelError`` subclasses."""
        sdk = self._client()
        try:
            return self._complete(sdk, request)
        except self.failures.api_error as err:
            failure = translate_failure(
                err, self.failures, secret=self._secret, key_source=self._key_source()
            )
        raise failure  # outside the handler: no chained SDK exception (see failures)

    @abstractmethod
    def _new_sdk(self, api_key: str, response_hooks: list[ResponseHook],
                 tls: ssl.SSLContext) -> SdkT:
        """Build the SDK client; ``response_hooks`` and ``tls`` (its ``verify``)
        go on its HTTP client."""

    @abstractmethod
    def _complete(self, sdk: SdkT, request: ModelRequest) -> ModelResponse:
        """One call through the SDK, mapped both ways."""

    def _output_limit(self, request: ModelRequest) -> int | None:
        """The request's own output limit wins over the client's default."""
        if request.max_output_tokens is not None:
            return request.max_output_tokens
        return self.max_output_tokens

    def _client(self) -> SdkT:
        """The calling thread's SDK client (``SDK_SHARDS``), built on first use."""
        shard: int | None = getattr(self._thread_shard, "index", None)
        if shard is None:
            shard = self._thread_shard.index = next(self._shards_given) % SDK_SHARDS
        sdk = self._sdks[shard]
        if sdk is not None:
            return sdk
        with self._lock:
            sdk = self._sdks[shard]
            if sdk is None:
                secret = self._read_key()
                if self._tls is None:
                    self._tls = _tls_context()
                sdk = self._sdks[shard] = self._new_sdk(
                    secret, [retry_after_guard(self.max_retry_after)], self._tls)
                self._secret = secret
            return sdk

    def _key_source(self) -> str:
        if self.api_key_file is not None:
            return f"file {self.api_key_file}"
        return f"${self.api_key_env}"

    def _read_key(self) -> str:
        if self.api_key_file is not None:
            try:
                key = self.api_key_file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise ModelError(
                    f"{self.provider}: cannot read the API key {self._key_source()}: {err.strerror}"
                ) from None
        else:
            key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ModelError(
                f"{self.provider}: no API key: {self._key_source()} is empty or unset "
                "(self-hosted servers that ignore keys accept any non-empty value)"
            )
        return key

    def close(self) -> None:
        """Release the SDK clients' connection pools; the next call builds fresh ones."""
        with self._lock:
            for sdk in self._sdks:
                if sdk is not None:
                    sdk.close()
            self._sdks = [None] * SDK_SHARDS
            self._secret = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the configuration only: never the SDK client, the key or the lock."""
        state = dict(self.__dict__)
        for runtime in ("_lock", "_sdks", "_tls", "_secret", "_thread_shard",
                        "_shards_given"):
            state.pop(runtime)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r}, "
            f"key={self._key_source()})"
        )


def _tls_context() -> ssl.SSLContext:
    """The TLS settings one model client's SDK clients share.

    Why shared: an SDK client's HTTP client otherwise builds its own, loading
    the CA bundle again: 0.8 MB each, so 51 MB for a threads worker's
    ``SDK_SHARDS`` clients, against 4 KB each with one context (which is safe
    to share between threads and connections). Built by the SDKs' HTTP library
    itself, so it trusts what each client would have (its CA bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``): httpx2 for current SDK releases,
    httpx for those from before their move to it."""
    try:
        library = importlib.import_module("httpx2")
    except ImportError:  # an SDK release from before the move to httpx2
        library = importlib.import_module("httpx")
    create: Callable[[], ssl.SSLContext] = library.create_ssl_context
    return create()


class WireModel(BaseModel):
    """The part of a provider's reply a client reads. Other keys are ignored,
    as the SDKs' own parse ignores them (servers and proxies add their own)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


WireT = TypeVar("WireT", bound=WireModel)


def parse_reply(raw: bytes, shape: type[WireT], *, provider: str, what: str) -> WireT:
    """A reply's body read as ``shape``; anything else is the model's (or its
    proxy's) fault: ``MalformedModelOutputError``, saying where, never what
    (a model's text stays out of error records, and may be megabytes).

    Why not the SDKs' typed replies: they are built without validation
    (``construct``), so a body of the wrong shape surfaced as an
    ``AttributeError`` or ``TypeError`` deep in the mapping, or as an empty
    answer, and building them cost a call about 0.1 ms of CPU.
    """
    try:
        return shape.model_validate(json.loads(raw))
    # JSONDecodeError, UnicodeDecodeError and ValidationError are ValueErrors;
    # RecursionError is the parser's own depth limit.
    except (ValueError, RecursionError) as err:
        raise MalformedModelOutputError(
            f"{provider}: the response is not {what}: {_where(err)}") from None


def _where(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors(include_url=False, include_input=False)[0]
        return f"{'.'.join(str(part) for part in first['loc']) or 'body'}: {first['msg']}"
    return type(err).__name__


def idempotency_headers(request: ModelRequest) -> dict[str, str]:
    """Headers that let a provider deduplicate a retried call (the SDKs resend them).

    The clients also give the same key as the SDK's ``idempotency_key``
    option: without it the SDK draws a ``uuid4`` per call (2% of a loaded
    IO-bound worker's GIL time, ``os.urandom`` included) for a header it never
    sends, since neither SDK names one."""
    return {"Idempotency-Key": request.idempotency_key}


def tool_arguments(raw: object, *, provider: str, tool: str) -> dict[str, Any]:
    """A tool call's arguments as a dict: a JSON object, given as text or already parsed."""
    value: object = raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            raise MalformedModelOutputError(
                f"{provider}: arguments of tool call {tool!r} are not JSON: {err}"
            ) from None
        except RecursionError:  # the parser's own depth limit
            raise MalformedModelOutputError(
                f"{provider}: arguments of tool call {tool!r} nest too deep to parse"
            ) from None
    if not isinstance(value, dict):
        raise MalformedModelOutputError(
            f"{provider}: arguments of tool call {tool!r} are not a JSON object "
            f"but {type(value).__name__}"
        )
    return value
