"""A model client keeps alive every connection its SDK may open
(``sdk_common.kept_alive``): a threads worker makes hundreds of model calls
at once through one client, and with the SDKs' default of 100 kept alive,
every call past the hundredth closed its connection after the answer and
opened a new one next time (a TLS handshake each, against a real provider).

Checked against a loopback server that keeps connections alive and counts
the ones it accepted: two rounds of more simultaneous calls than 100 must
reuse the first round's connections; and a client spreads its threads over a
few SDK clients, so no one pool holds them all."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent_worker.core.messages import Message, ModelRequest
from agent_worker.model import sdk_common
from agent_worker.model.anthropic_client import AnthropicModel
from agent_worker.model.openai_client import OpenAIChatModel
from agent_worker.model.sdk_common import SdkModel
from tests.fakes.keepalive import serve_keepalive

KEY_ENV = "AW_TEST_POOL_KEY"
AT_ONCE = 150  # above the SDKs' 100 kept alive
MORE_THREADS_THAN_SHARDS = sdk_common.SDK_SHARDS + 16

ANSWERS = {
    "/v1/chat/completions": {
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
    "/v1/messages": {
        "id": "m", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}},
}


class KeepAliveServer:
    """HTTP/1.1 with keep-alive on one asyncio loop; answers a round of
    ``AT_ONCE`` calls once all of them have arrived, and counts the
    connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0
        self._arrived = 0
        self._rounds: dict[int, asyncio.Event] = {}
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=512))
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await serve_keepalive(reader, writer, self._answer)

    async def _answer(self, path: str, _headers: Mapping[str, str]) -> bytes:
        # Held until the whole round's calls have arrived, so each round has
        # all of them in flight at once however the threads were scheduled.
        self._arrived += 1
        round_in = self._rounds.setdefault((self._arrived - 1) // AT_ONCE, asyncio.Event())
        if self._arrived % AT_ONCE == 0:
            round_in.set()
        await asyncio.wait_for(round_in.wait(), 30)
        return json.dumps(ANSWERS[path]).encode()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            serving = asyncio.all_tasks() - {asyncio.current_task()}
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeepAliveServer]:
    monkeypatch.setenv(KEY_ENV, "sk-pool-test")
    running = KeepAliveServer()
    yield running
    running.close()


def _round(model: SdkModel[Any], threads: ThreadPoolExecutor) -> None:
    """``AT_ONCE`` calls, started together, one on each of ``threads`` (a
    worker's lap threads live as long as the worker)."""
    start = threading.Barrier(AT_ONCE)

    def call(i: int) -> None:
        start.wait(30)
        model.complete(ModelRequest(run_id="r", lap=i + 1, instructions="",
                                    idempotency_key=f"r:{i + 1}:model",
                                    messages=(Message(role="user", content="hi"),)))

    for done in [threads.submit(call, i) for i in range(AT_ONCE)]:
        done.result(60)


CLIENTS: dict[str, Callable[[str], SdkModel[Any]]] = {
    "openai": lambda url: OpenAIChatModel("m", base_url=url + "/v1", api_key_env=KEY_ENV,
                                          max_retries=0),
    "anthropic": lambda url: AnthropicModel("m", base_url=url, api_key_env=KEY_ENV,
                                                max_retries=0),
}


@pytest.mark.parametrize("provider", list(CLIENTS))
def test_many_calls_at_once_reuse_their_connections(
        server: KeepAliveServer, provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_common, "SDK_SHARDS", 1)  # every call in one pool, past 100
    model = CLIENTS[provider](server.url)
    try:
        with ThreadPoolExecutor(AT_ONCE) as threads:
            _round(model, threads)
            first = server.accepted
            _round(model, threads)
    finally:
        model.close()
    assert first <= AT_ONCE
    assert server.accepted == first, (
        f"the second round opened {server.accepted - first} new connections")


def test_threads_spread_over_a_few_sdk_clients_and_keep_to_theirs(
        server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pool per ``SDK_SHARDS`` threads' share, not one for all of them:
    the HTTP library scans its whole pool for every request it places. A
    process of one thread builds one client, and a thread keeps its own."""
    built: list[object] = []
    new_sdk = OpenAIChatModel._new_sdk

    def counted(self: OpenAIChatModel, *args: Any) -> Any:
        built.append(sdk := new_sdk(self, *args))
        return sdk

    monkeypatch.setattr(OpenAIChatModel, "_new_sdk", counted)
    model = CLIENTS["openai"](server.url)
    try:
        mine = model._client()
        assert model._client() is mine and len(built) == 1
        with ThreadPoolExecutor(MORE_THREADS_THAN_SHARDS) as threads:
            start = threading.Barrier(MORE_THREADS_THAN_SHARDS)

            def pair() -> bool:
                start.wait(30)
                return model._client() is model._client()

            assert all(threads.map(lambda _: pair(), range(MORE_THREADS_THAN_SHARDS)))
        assert len(built) == sdk_common.SDK_SHARDS
    finally:
        model.close()


@pytest.mark.parametrize("provider", list(CLIENTS))
def test_a_clients_sdk_clients_share_one_tls_context(
        provider: str, server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CA bundle is loaded once per model client, not once per SDK client
    (0.8 MB each, 51 MB for a threads worker's 64): the SDK clients share the
    TLS context ``sdk_common._tls_context`` builds."""
    loads: list[object] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    model = CLIENTS[provider](server.url)
    try:
        with ThreadPoolExecutor(MORE_THREADS_THAN_SHARDS) as threads:
            start = threading.Barrier(MORE_THREADS_THAN_SHARDS)

            def client() -> int:
                start.wait(30)
                return id(model._client())

            clients = set(threads.map(lambda _: client(), range(MORE_THREADS_THAN_SHARDS)))
        assert len(clients) == sdk_common.SDK_SHARDS
        assert len(loads) == 1
    finally:
        model.close()


def test_the_tls_context_comes_from_httpx_where_the_sdks_predate_httpx2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SDK releases before their move to httpx2 bring httpx: the shared
    context is then httpx's, with the same verification."""
    monkeypatch.setitem(sys.modules, "httpx2", None)  # import httpx2 -> ImportError
    tls = sdk_common._tls_context()
    assert tls.verify_mode is ssl.CERT_REQUIRED and tls.check_hostname
    assert tls.get_ca_certs()
