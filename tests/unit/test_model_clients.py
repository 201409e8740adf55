"""Both provider clients, driven through their real SDKs over loopback HTTP.

Every test runs once per provider against ``FakeLLMServer``: wire mapping both ways,
usage, the SDKs' bounded retries (Retry-After, 5xx, dropped connections) and the error
classes the lap engine dispatches on, and that the API key leaks nowhere.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent_worker.core.errors import (
    ContextLengthError,
    MalformedModelOutputError,
    ModelError,
    ModelRefusalError,
    TransientModelError,
)
from agent_worker.core.messages import Message, ModelRequest, ToolSpec, Usage
from agent_worker.model.anthropic_client import AnthropicModel
from agent_worker.model.failures import RateLimitedError
from agent_worker.model.openai_client import OpenAIChatModel
from agent_worker.model.pricing import DEFAULT_PRICES, Price, PriceTable
from agent_worker.model.protocol import ModelClient
from agent_worker.model.sdk_common import SdkModel
from tests.fakes import fake_server
from tests.fakes.fake_server import FakeLLMServer

KEY = "sk-test-7f3a9c1e5b2d4f60-do-not-leak"
KEY_ENV = "AW_TEST_MODEL_KEY"

LOOKUP = ToolSpec(
    name="lookup_order",
    description="Find an order by id.",
    parameters={"type": "object", "properties": {"order": {"type": "integer"}}},
)
TWO_LAPS: list[dict[str, Any]] = [
    {
        "text": "Let me look.",
        "tool_calls": [
            {"name": "lookup_order", "arguments": {"order": 7}},
            {"name": "lookup_order", "arguments": {"order": 8}},
        ],
        "usage": {"input": 11, "output": 5},
    },
    {"text": "Both orders shipped.", "usage": {"input": 40, "output": 6}},
]

MakeClient = Callable[..., SdkModel[Any]]


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_client(provider: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeClient]:
    """Build the provider's client against a server; close every client afterwards."""
    monkeypatch.setenv(KEY_ENV, KEY)
    made: list[SdkModel[Any]] = []

    def make(server: FakeLLMServer, **options: Any) -> SdkModel[Any]:
        options = {"api_key_env": KEY_ENV, "max_retries": 2, **options}
        client: SdkModel[Any]
        if provider == "openai":
            client = OpenAIChatModel("gpt-4o-mini", base_url=server.url + "/v1", **options)
        else:
            client = AnthropicModel("claude-haiku-4-5", base_url=server.url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(TWO_LAPS) as running:
        yield running


def lap_request(lap: int, *history: Message) -> ModelRequest:
    return ModelRequest(
        run_id="run-1",
        lap=lap,
        instructions="You are a refund desk.",
        messages=(Message(role="user", content="Where are orders 7 and 8?"), *history),
        tools=(LOOKUP,),
        idempotency_key=f"run-1:{lap}:model",
    )


def test_clients_satisfy_the_protocol(make_client: MakeClient, server: FakeLLMServer) -> None:
    assert isinstance(make_client(server), ModelClient)


def test_plain_text_turn(make_client: MakeClient, provider: str) -> None:
    with FakeLLMServer([{"text": "Hello!", "usage": {"input": 9, "output": 2}}]) as srv:
        response = make_client(srv).complete(lap_request(0))

    assert response.message.role == "assistant"
    assert response.message.content == "Hello!"
    assert response.message.tool_calls == ()
    assert response.usage == Usage(input_tokens=9, output_tokens=2)
    assert response.model in ("gpt-4o-mini", "claude-haiku-4-5")
    assert response.stop_reason == ("stop" if provider == "openai" else "end_turn")
    body = srv.requests[0]["body"]
    if provider == "openai":
        assert body["messages"][0] == {"role": "system", "content": "You are a refund desk."}
    else:
        assert body["system"] == "You are a refund desk."


def test_tool_calls_round_trip(
    make_client: MakeClient, server: FakeLLMServer, provider: str
) -> None:
    client = make_client(server)
    first = client.complete(lap_request(0))
    calls = first.message.tool_calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("lookup_order", {"order": 7}),
        ("lookup_order", {"order": 8}),
    ]
    assert first.message.content == "Let me look."
    assert first.usage == Usage(input_tokens=11, output_tokens=5)

    results = [
        Message(role="tool", tool_call_id=c.id, content=f"order {c.arguments['order']} shipped")
        for c in calls
    ]
    second = client.complete(lap_request(1, first.message, *results))
    assert second.message.content == "Both orders shipped."
    assert second.usage == Usage(input_tokens=40, output_tokens=6)

    first_body, second_body = (r["body"] for r in server.requests)
    wire = second_body["messages"]
    if provider == "openai":
        assert first_body["tools"] == [
            {"type": "function", "function": LOOKUP.model_dump()},
        ]
        assistant = wire[2]
        assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
            {"order": 7},
            {"order": 8},
        ]
        assert [(m["role"], m["tool_call_id"]) for m in wire[3:]] == [
            ("tool", calls[0].id),
            ("tool", calls[1].id),
        ]
    else:
        assert first_body["tools"][0]["input_schema"] == LOOKUP.parameters
        assistant = wire[1]
        assert [b["type"] for b in assistant["content"]] == ["text", "tool_use", "tool_use"]
        # Both results in one user turn, as the messages API requires.
        assert len(wire) == 3
        assert wire[2]["role"] == "user"
        assert [(b["type"], b["tool_use_id"]) for b in wire[2]["content"]] == [
            ("tool_result", calls[0].id),
            ("tool_result", calls[1].id),
        ]


def test_headers_carry_idempotency_key_and_auth(
    make_client: MakeClient, server: FakeLLMServer
) -> None:
    make_client(server).complete(lap_request(0))

    headers = server.requests[0]["headers"]
    assert headers["idempotency-key"] == "run-1:0:model"
    assert KEY in (headers.get("authorization", "") + headers.get("x-api-key", ""))


def test_429_waits_for_retry_after(make_client: MakeClient, server: FakeLLMServer) -> None:
    server.queue_fault("429", retry_after=1)

    started = time.monotonic()
    response = make_client(server).complete(lap_request(0))
    waited = time.monotonic() - started

    assert response.message.tool_calls
    assert waited >= 1.0
    assert [r["outcome"] for r in server.requests] == ["fault:429", "ok"]


def test_retry_after_beyond_the_bound_goes_back_to_the_engine(
    make_client: MakeClient, server: FakeLLMServer
) -> None:
    server.queue_fault("429", retry_after=30)

    started = time.monotonic()
    with pytest.raises(RateLimitedError) as caught:
        make_client(server, max_retry_after=2.0).complete(lap_request(0))

    assert time.monotonic() - started < 5
    assert caught.value.retry_after == 30
    assert caught.value.retriable
    assert len(server.requests) == 1


@pytest.mark.timeout(30)  # the failure this guards against is a 49-day sleep
@pytest.mark.parametrize("asked", ["inf", "Infinity", "1e309", "nan"])
def test_a_retry_after_that_is_not_a_finite_number_goes_back_to_the_engine(
    make_client: MakeClient, server: FakeLLMServer, asked: str
) -> None:
    """The Anthropic SDK sleeps for ``Retry-After: inf`` (capped at 49 days);
    the guard counts a wait it cannot read as a finite number as too long."""
    server.queue_fault("429", retry_after=asked)

    started = time.monotonic()
    with pytest.raises(RateLimitedError) as caught:
        make_client(server, max_retry_after=2.0).complete(lap_request(0))

    assert time.monotonic() - started < 5
    assert caught.value.retry_after is None  # the engine's own backoff, not infinity
    assert len(server.requests) == 1


def test_500_then_success(make_client: MakeClient, server: FakeLLMServer) -> None:
    server.queue_fault("500")

    response = make_client(server).complete(lap_request(0))

    assert response.message.tool_calls
    assert [r["outcome"] for r in server.requests] == ["fault:500", "ok"]


def test_persistent_500_is_transient(make_client: MakeClient, server: FakeLLMServer) -> None:
    for _ in range(3):
        server.queue_fault("500")

    with pytest.raises(TransientModelError) as caught:
        make_client(server, max_retries=1).complete(lap_request(0))

    assert not isinstance(caught.value, RateLimitedError)
    assert "HTTP 500" in str(caught.value)
    assert len(server.requests) == 2  # one try and max_retries=1 retry, no more


def test_dropped_response_is_retried_under_the_same_key(
    make_client: MakeClient, server: FakeLLMServer
) -> None:
    server.queue_fault("drop")

    response = make_client(server).complete(lap_request(0))

    assert response.message.tool_calls
    log = server.requests
    assert [r["outcome"] for r in log] == ["dropped", "ok"]
    assert {r["headers"]["idempotency-key"] for r in log} == {"run-1:0:model"}


def test_timeout_is_transient(make_client: MakeClient, server: FakeLLMServer) -> None:
    server.queue_fault("slow", delay=0.8)

    with pytest.raises(TransientModelError):
        make_client(server, timeout=0.2, max_retries=0).complete(lap_request(0))


def test_context_length(make_client: MakeClient, server: FakeLLMServer) -> None:
    server.queue_fault("context_length")

    with pytest.raises(ContextLengthError):
        make_client(server).complete(lap_request(0))
    assert len(server.requests) == 1  # not retried


def test_malformed_tool_arguments(make_client: MakeClient) -> None:
    script = [{"tool_calls": [{"name": "lookup_order", "arguments": "{order: 7"}]}]
    with FakeLLMServer(script) as srv, pytest.raises(MalformedModelOutputError):
        make_client(srv).complete(lap_request(0))


def test_refusal(make_client: MakeClient) -> None:
    script = [{"refusal": "I can't help with that."}]
    with FakeLLMServer(script) as srv, pytest.raises(ModelRefusalError):
        make_client(srv).complete(lap_request(0))


def test_key_leaks_nowhere(make_client: MakeClient, server: FakeLLMServer) -> None:
    client = make_client(server)
    response = client.complete(lap_request(0))
    # The fake answers 401 quoting the key it received, as some providers do.
    server.queue_fault("401")
    with pytest.raises(ModelError) as caught:
        client.complete(lap_request(1))

    assert server.requests[-1]["outcome"] == "fault:401"
    assert KEY_ENV in str(caught.value)
    for text in (
        repr(client),
        str(caught.value),
        repr(caught.value),
        response.model_dump_json(),
        pickle.dumps(client).decode("latin-1"),
    ):
        assert KEY not in text
    # The SDK's exception (its request holds the auth header) is not kept around.
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None


def test_unpickled_client_reads_the_key_again(
    make_client: MakeClient, server: FakeLLMServer
) -> None:
    client = make_client(server)
    client.complete(lap_request(0))
    clone: SdkModel[Any] = pickle.loads(pickle.dumps(client))
    try:
        assert clone.complete(lap_request(0)).message.tool_calls
    finally:
        clone.close()


def test_key_is_read_lazily_and_a_missing_key_is_a_clear_error(
    make_client: MakeClient, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    client = make_client(server)  # constructing needs no key

    with pytest.raises(ModelError, match=KEY_ENV) as caught:
        client.complete(lap_request(0))
    assert not caught.value.retriable
    assert server.requests == []


def test_key_from_a_secrets_file(
    make_client: MakeClient, server: FakeLLMServer, tmp_path: Path
) -> None:
    secret = tmp_path / "model.key"
    secret.write_text(KEY + "\n", encoding="utf-8")

    client = make_client(server, api_key_env="AW_TEST_UNSET_VARIABLE", api_key_file=secret)
    client.complete(lap_request(0))

    headers = server.requests[0]["headers"]
    assert headers.get("authorization") == f"Bearer {KEY}" or headers.get("x-api-key") == KEY
    assert str(secret) in repr(client)


def test_fake_server_runs_as_a_process_and_picks_turns_by_lap(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(TWO_LAPS), encoding="utf-8")
    root = Path(fake_server.__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    second_lap = {"model": "m", "messages": [{"role": "user"}, {"role": "assistant"}]}

    answers = []
    for _restart in range(2):
        command = [sys.executable, "-m", "tests.fakes.fake_server", "--script", str(script)]
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
            try:
                assert proc.stdout is not None
                url = proc.stdout.readline().split()[-1]
                answers.append(_post(url + "/v1/chat/completions", second_lap))
                _post(url + "/_faults", [{"fault": "500"}])
                with pytest.raises(urllib.error.HTTPError) as caught:
                    _post(url + "/v1/messages", second_lap)
                assert caught.value.code == 500
                caught.value.close()
                with urllib.request.urlopen(url + "/_requests") as reply:
                    log = json.load(reply)
                assert [(r["api"], r["lap"], r["outcome"]) for r in log] == [
                    ("openai", 1, "ok"),
                    ("anthropic", 1, "fault:500"),
                ]
            finally:
                proc.terminate()
                proc.wait(timeout=10)

    texts = [a["choices"][0]["message"]["content"] for a in answers]
    assert texts == ["Both orders shipped.", "Both orders shipped."]


def _post(url: str, payload: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request) as reply:
        return json.load(reply)


def test_price_table_prefix_match_and_unknown_models() -> None:
    usage = Usage(input_tokens=2_000_000, output_tokens=500_000)

    assert DEFAULT_PRICES.cost("gpt-4o-mini-2024-07-18", usage) == Decimal("0.60")
    assert DEFAULT_PRICES.cost("gpt-4o-2024-08-06", usage) == Decimal("10.00")
    assert DEFAULT_PRICES.cost("llama3:8b", usage) == Decimal(0)

    table = PriceTable.from_json({"llama3": {"input_per_mtok": 0.1, "output_per_mtok": "0.2"}})
    assert table["llama3"] == Price(input_per_mtok=Decimal("0.1"), output_per_mtok=Decimal("0.2"))
    assert table.cost("llama3:8b", usage) == Decimal("0.3")
    merged = PriceTable({**DEFAULT_PRICES, **table})
    assert merged.lookup("claude-sonnet-4-20250514") == DEFAULT_PRICES["claude-sonnet-4"]
