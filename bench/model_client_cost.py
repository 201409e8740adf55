"""CPU of one model call through the OpenAI client, and through leaner HTTP
paths carrying the same bytes: ``python -m bench.model_client_cost``.

An IO-bound worker spends about a third of its CPU in the model client
(BENCHMARKS.md, "The worker's garbage collector"). This measures, in one
process against ``bench.io_provider`` answering at once, the CPU per call of:
``OpenAIChatModel.complete`` as a lap calls it (the SDK's generic ``post``,
the reply parsed by ``from_openai_json``); the SDK's typed
``chat.completions.create`` as the client called it before, its reply parsed
into a ``ChatCompletion`` and left there; the same with its reply left
unparsed (``with_raw_response``); the SDK's own httpx client sent the wire
body ``wire_body`` builds; and ``http.client`` on one kept-alive connection.
Each path sends the same 40-message window of the benchmark's workload and
reads the reply's JSON, so the differences are the layers, not the payload.
The provider runs in its own process, so its CPU is not counted here.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from agent_worker.core.messages import Message, ModelRequest, ToolCall
from agent_worker.model.openai_client import OpenAIChatModel, wire_body
from agent_worker.model.sdk_common import idempotency_headers
from bench.agents import read
from bench.workload import ASSISTANT_TEXT_CHARS, TOOL_NAME, TOOL_TEXT_CHARS, prose

_KEY_ENV = "AGENT_WORKER_BENCH_MODEL_KEY"
_RUN = "mcc-n1000-0001"


def window(turns: int = 20) -> tuple[Message, ...]:
    """``turns`` laps of the workload: an assistant turn with one call, its result."""
    out: list[Message] = []
    for i in range(turns):
        call = ToolCall(id=f"call_{i}", name=TOOL_NAME, arguments={"path": f"notes/{i}.md"})
        out.append(Message(role="assistant", content=prose(f"a{i}", ASSISTANT_TEXT_CHARS),
                           tool_calls=(call,)))
        out.append(Message(role="tool", content=prose(f"t{i}", TOOL_TEXT_CHARS),
                           tool_call_id=call.id, name=TOOL_NAME))
    return tuple(out)


def paths(port: int) -> dict[str, Callable[[ModelRequest], Any]]:
    """Each way of making the call, by name."""
    os.environ.setdefault(_KEY_ENV, "bench")
    model = OpenAIChatModel("io", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=_KEY_ENV,
                            max_retries=0, timeout=30.0)
    sdk = model._client()  # the client complete() uses, built once
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}

    def typed(r: ModelRequest) -> Any:
        return sdk.chat.completions.create(
            model="io", messages=[], extra_headers=idempotency_headers(r),
            extra_body=wire_body(r))

    def unparsed(r: ModelRequest) -> Any:
        raw = sdk.chat.completions.with_raw_response.create(
            model="io", messages=[], extra_headers=idempotency_headers(r),
            extra_body=wire_body(r))
        return json.loads(raw.http_response.content)

    def sdk_httpx(r: ModelRequest) -> Any:
        body = json.dumps({"model": "io", **wire_body(r)})
        reply = sdk._client.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=body,
                                 headers={**headers, **idempotency_headers(r)})
        return json.loads(reply.content)

    def stdlib(r: ModelRequest) -> Any:
        body = json.dumps({"model": "io", **wire_body(r)}).encode()
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={**headers, **idempotency_headers(r)})
        return json.loads(conn.getresponse().read())

    return {"OpenAIChatModel.complete": model.complete,
            "SDK's typed create": typed,
            "SDK's typed create, reply not parsed": unparsed,
            "SDK's httpx client, wire body": sdk_httpx,
            "http.client, wire body": stdlib}


def cpu_per_call(call: Callable[[ModelRequest], Any], messages: tuple[Message, ...],
                 calls: int) -> float:
    """Milliseconds of this process's CPU per call, after 50 warm-up calls."""
    def request(lap: int) -> ModelRequest:
        return ModelRequest(run_id=_RUN, lap=lap, instructions="Work through the plan.",
                            messages=messages, tools=(read.spec,),
                            idempotency_key=f"{_RUN}:{lap}:model")

    for lap in range(1, 51):
        call(request(lap))
    started = time.process_time()
    for i in range(calls):
        call(request(i % 900 + 1))
    return (time.process_time() - started) / calls * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.model_client_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per path and repeat")
    p.add_argument("--repeats", type=int, default=3, help="turns of every path")
    p.add_argument("--port", type=int, default=63901, help="the provider's port")
    a = p.parse_args(argv)
    provider = subprocess.Popen([sys.executable, "-m", "bench.io_provider", "--port",
                                 str(a.port), "--latency", "0"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        ways, messages = paths(a.port), window()
        got: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(a.repeats):
            for name, call in ways.items():
                got[name].append(cpu_per_call(call, messages, a.calls))
        print(f"CPU per call, ms (median [min-max] of {a.repeats} turns of {a.calls} calls; "
              f"load {os.getloadavg()[0]:.1f}):")
        for name, values in got.items():
            print(f"  {name:38s} {statistics.median(values):.3f} "
                  f"[{min(values):.3f}-{max(values):.3f}]")
    finally:
        provider.terminate()
        provider.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
