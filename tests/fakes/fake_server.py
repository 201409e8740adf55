"""A loopback stand-in for the OpenAI and Anthropic HTTP APIs, with scripted answers.

Why: the model clients must be exercised through the real SDKs over real HTTP (headers,
retries, Retry-After, dropped connections, error bodies), without a network or a key,
and so must whole runs driven by separate worker processes.

Routes (any path prefix is accepted, so one base URL serves both SDKs):

* ``POST .../chat/completions`` — OpenAI; give the SDK ``base_url=<url>/v1``.
* ``POST .../v1/messages`` — Anthropic; give the SDK ``base_url=<url>``.
* ``POST /_faults`` — queue one fault object or a list of them.
* ``GET /_requests`` — the log of model requests received: headers, body, lap, outcome.
* ``POST /_reset`` — clear the log and the fault queue, re-arm the script's faults.

A script is a JSON list. A *turn* is
``{"text": str, "tool_calls": [{"name": str, "arguments": {...}}], "usage":
{"input": n, "output": n}, "refusal": str}`` (all keys optional; ``arguments`` given as a
string is sent verbatim, to script malformed output). The answer to a request is the
turn whose index is the number of assistant messages already in it — its lap — so
every worker process, and a restarted server, answers a lap the same way.

A *fault* is ``{"fault": kind, ...}``: ``"429"`` or any other HTTP status (with an
optional ``"retry_after"`` in seconds), ``"context_length"`` (the provider's 400),
``"drop"`` (the answer is produced and logged, then the connection closes unanswered),
or ``"slow"`` (answer after ``"delay"`` seconds). With ``tokens_per_minute`` the server
keeps a provider's rate limit: a request whose usage would take the last 60 seconds
over it gets a 429 with the Retry-After that would let it fit (logged as
``fault:429-tpm``); every log entry carries its wall-clock ``at``.

Faults queued by ``/_faults`` hit the next requests whatever their lap; a fault
written in the script before turn *k* hits the first request for lap *k* (once per
server lifetime). A ``"401"`` fault echoes the caller's key in its message, as
careless providers do, to test that clients scrub it.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

JSON = dict[str, Any]

_TURN_KEYS = frozenset({"text", "tool_calls", "usage", "refusal"})
_NAMED_FAULTS = frozenset({"context_length", "drop", "slow"})


def validate_fault(fault: Mapping[str, Any]) -> JSON:
    """A copy of ``fault`` if it names a known fault; ``ValueError`` otherwise."""
    kind = str(fault.get("fault", ""))
    is_status = kind.isdigit() and 400 <= int(kind) <= 599
    if not (is_status or kind in _NAMED_FAULTS):
        raise ValueError(f"unknown fault {kind!r}: use an HTTP status or one of {_NAMED_FAULTS}")
    return dict(fault)


def load_script(entries: Sequence[Mapping[str, Any]]) -> tuple[list[JSON], dict[int, list[JSON]]]:
    """Split a script into its turns and the faults that precede each turn index."""
    turns: list[JSON] = []
    faults: dict[int, list[JSON]] = {}
    for entry in entries:
        if "fault" in entry:
            faults.setdefault(len(turns), []).append(validate_fault(entry))
            continue
        unknown = set(entry) - _TURN_KEYS
        if unknown:
            raise ValueError(f"script turn {len(turns)} has unknown keys {sorted(unknown)}")
        turns.append(dict(entry))
    return turns, faults


class _State:
    """Everything the handler threads share, behind one lock."""

    def __init__(self, script: Sequence[Mapping[str, Any]],
                 tokens_per_minute: int | None = None) -> None:
        self.lock = threading.Lock()
        self.turns, self._script_faults = load_script(script)
        self.armed: dict[int, deque[JSON]] = {}
        self.queue: deque[JSON] = deque()
        self.log: list[JSON] = []
        self.tokens_per_minute = tokens_per_minute
        self.served: deque[tuple[float, int]] = deque()
        self.reset()

    def over_limit(self, tokens: int) -> float | None:
        """With a tokens-per-minute limit, as a provider keeps one: ``None``
        and the tokens counted if ``tokens`` more fit the last 60 s, else the
        seconds until they would (the 429's Retry-After)."""
        if self.tokens_per_minute is None:
            return None
        with self.lock:
            now = time.monotonic()
            while self.served and self.served[0][0] <= now - 60:
                self.served.popleft()
            used = sum(n for _, n in self.served)
            if used + tokens <= self.tokens_per_minute:
                self.served.append((now, tokens))
                return None
            freed = 0
            for at, n in self.served:
                freed += n
                if used - freed + tokens <= self.tokens_per_minute:
                    return max(0.1, at + 60 - now)
            return 60.0

    def reset(self) -> None:
        with self.lock:
            self.armed = {lap: deque(fs) for lap, fs in self._script_faults.items()}
            self.queue.clear()
            self.log.clear()
            self.served.clear()

    def next_fault(self, lap: int) -> JSON | None:
        with self.lock:
            if self.queue:
                return self.queue.popleft()
            pending = self.armed.get(lap)
            return pending.popleft() if pending else None

    def record(self, entry: JSON) -> None:
        with self.lock:
            entry["seq"] = len(self.log)
            self.log.append(entry)


class _Wire:
    """One provider's JSON shapes: how to read the lap, and how to answer or fail."""

    name = ""

    def lap(self, body: JSON) -> int:
        return sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")

    def answer(self, body: JSON, turn: JSON, lap: int, usage: tuple[int, int]) -> JSON:
        raise NotImplementedError

    def error(self, status: int, kind: str, message: str, code: str | None) -> JSON:
        raise NotImplementedError


class _OpenAIWire(_Wire):
    name = "openai"

    def answer(self, body: JSON, turn: JSON, lap: int, usage: tuple[int, int]) -> JSON:
        calls = [
            {
                "id": f"call_{lap}_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": _arguments_text(call)},
            }
            for i, call in enumerate(turn.get("tool_calls", ()))
        ]
        message: JSON = {
            "role": "assistant",
            "content": None if turn.get("refusal") else turn.get("text", ""),
            "refusal": turn.get("refusal"),
        }
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-fake-{lap}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": sum(usage),
            },
        }

    def error(self, status: int, kind: str, message: str, code: str | None) -> JSON:
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _AnthropicWire(_Wire):
    name = "anthropic"

    def answer(self, body: JSON, turn: JSON, lap: int, usage: tuple[int, int]) -> JSON:
        content: list[JSON] = []
        if turn.get("text"):
            content.append({"type": "text", "text": turn["text"]})
        for i, call in enumerate(turn.get("tool_calls", ())):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{lap}_{i}",
                    "name": call["name"],
                    "input": call.get("arguments", {}),
                }
            )
        stop = "refusal" if turn.get("refusal") else "tool_use" if turn.get("tool_calls") else None
        return {
            "id": f"msg_fake_{lap}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": content,
            "stop_reason": stop or "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }

    def error(self, status: int, kind: str, message: str, code: str | None) -> JSON:
        return {"type": "error", "error": {"type": kind, "message": message}}


def _arguments_text(call: Mapping[str, Any]) -> str:
    arguments = call.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _usage(body: JSON, turn: JSON) -> tuple[int, int]:
    """The turn's scripted usage, else about four characters a token."""
    scripted = turn.get("usage", {})
    estimate_in = len(json.dumps(body.get("messages", []))) // 4 + 1
    estimate_out = (len(turn.get("text", "")) + len(json.dumps(turn.get("tool_calls", [])))) // 4
    return int(scripted.get("input", estimate_in)), int(scripted.get("output", estimate_out + 1))


#: (error type, code) per status as each provider words it.
_ERROR_KINDS: dict[str, dict[int, tuple[str, str | None]]] = {
    "openai": {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        429: ("requests", "rate_limit_exceeded"),
        500: ("server_error", None),
    },
    "anthropic": {
        400: ("invalid_request_error", None),
        401: ("authentication_error", None),
        429: ("rate_limit_error", None),
        500: ("api_error", None),
        529: ("overloaded_error", None),
    },
}


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.0: one request per connection, so stopping never waits on idle clients."""

    server: _Server
    _wires: Mapping[str, _Wire] = {
        "/chat/completions": _OpenAIWire(),
        "/messages": _AnthropicWire(),
    }

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the record."""

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/_requests":
            with self.server.state.lock:
                log = copy.deepcopy(self.server.state.log)
            self._send(200, log)
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        body = self._body()
        if path == "/_faults":
            self._queue_faults(body)
        elif path == "/_reset":
            self.server.state.reset()
            self._send(200, {"ok": True})
        else:
            wire = next((w for suffix, w in self._wires.items() if path.endswith(suffix)), None)
            if wire is None or not isinstance(body, dict):
                self._send(404, {"error": f"no route {self.path}"})
            else:
                self._model_call(wire, body)

    def _queue_faults(self, body: Any) -> None:
        try:
            faults = [validate_fault(f) for f in (body if isinstance(body, list) else [body])]
        except (ValueError, AttributeError) as err:
            self._send(400, {"error": str(err)})
            return
        with self.server.state.lock:
            self.server.state.queue.extend(faults)
        self._send(200, {"queued": len(faults)})

    def _model_call(self, wire: _Wire, body: JSON) -> None:
        state = self.server.state
        lap = wire.lap(body)
        entry: JSON = {
            "api": wire.name,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
            "lap": lap,
            "at": time.time(),
        }
        fault = state.next_fault(lap)
        kind = fault["fault"] if fault else None
        if fault is not None and kind == "slow":
            time.sleep(float(fault.get("delay", 1.0)))
        if fault is not None and kind not in ("slow", "drop"):
            entry["outcome"] = f"fault:{kind}"
            state.record(entry)
            self._fail(wire, fault)
            return
        if lap >= len(state.turns):
            entry["outcome"] = "script_exhausted"
            state.record(entry)
            message = f"fake server script has {len(state.turns)} turns, no turn for lap {lap}"
            self._send(400, wire.error(400, "invalid_request_error", message, None))
            return
        turn = state.turns[lap]
        usage = _usage(body, turn)
        wait = state.over_limit(sum(usage))
        if wait is not None:
            entry["outcome"] = "fault:429-tpm"
            state.record(entry)
            self._fail(wire, {"fault": "429", "retry_after": round(wait, 1)})
            return
        answer = wire.answer(body, turn, lap, usage)
        entry["usage"] = {"input": usage[0], "output": usage[1]}
        entry["outcome"] = "dropped" if kind == "drop" else "ok"
        state.record(entry)
        if kind == "drop":
            # Produced (and billed, as a provider would) but never delivered.
            self.close_connection = True
            return
        self._send(200, answer)

    def _fail(self, wire: _Wire, fault: JSON) -> None:
        kind = str(fault["fault"])
        status = 400 if kind == "context_length" else int(kind)
        error_type, code = _ERROR_KINDS[wire.name].get(
            status, _ERROR_KINDS[wire.name][500 if status >= 500 else 400]
        )
        message = f"fake fault {kind}"
        if kind == "context_length":
            message, code = (
                "prompt is too long: 200001 tokens > 200000 maximum"
                if wire.name == "anthropic"
                else "This model's maximum context length is 128000 tokens. "
                "However, your messages resulted in 200001 tokens.",
                "context_length_exceeded",
            )
        elif status == 401:
            key = self.headers.get("x-api-key") or self.headers.get("authorization") or ""
            message = f"Incorrect API key provided: {key.removeprefix('Bearer ')}"
        headers = {}
        if "retry_after" in fault:
            headers["retry-after"] = str(fault["retry_after"])
        self._send(status, wire.error(status, error_type, message, code), headers)

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return None

    def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    """Handler threads are joined on close; each lives for one request (HTTP/1.0)."""

    daemon_threads = False

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that hung up (timeouts under test); loud about the rest."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeLLMServer:
    """The fake server on a background thread, as a context manager.

    ``url`` is ``http://127.0.0.1:PORT``: pass ``url + "/v1"`` as the OpenAI SDK's
    ``base_url`` (requests go to ``/v1/chat/completions``) and ``url`` itself as the
    Anthropic SDK's (``/v1/messages``). Other processes reach the same state over
    HTTP through ``/_faults``, ``/_requests`` and ``/_reset``.
    """

    def __init__(
        self,
        script: Sequence[Mapping[str, Any]] | str | Path = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tokens_per_minute: int | None = None,
    ) -> None:
        entries = (
            json.loads(Path(script).read_text(encoding="utf-8"))
            if isinstance(script, str | Path)
            else script
        )
        self._state = _State(entries, tokens_per_minute)
        self._server = _Server((host, port), self._state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[JSON]:
        """A copy of the model requests received so far, oldest first."""
        with self._state.lock:
            return copy.deepcopy(self._state.log)

    def queue_fault(self, fault: str, **params: Any) -> None:
        """Make the next model request fail: ``queue_fault("429", retry_after=1)``."""
        checked = validate_fault({"fault": fault, **params})
        with self._state.lock:
            self._state.queue.append(checked)

    def reset(self) -> None:
        """Forget requests and queued faults; re-arm the script's faults."""
        self._state.reset()

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-llm-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until interrupted (the ``python -m`` mode)."""
        try:
            self._server.serve_forever(poll_interval=0.05)
        finally:
            self.stop()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tests.fakes.fake_server --port P --script FILE.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="JSON list of turns and faults")
    args = parser.parse_args(argv)
    server = FakeLLMServer(args.script or (), host=args.host, port=args.port)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    # The first line tells a parent process where to connect (useful with --port 0).
    print(f"fake LLM server listening on {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
