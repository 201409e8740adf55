"""A loopback OpenAI-compatible provider that answers every chat completion after
a fixed latency: ``python -m bench.io_provider --port P --latency 1.0``.

Why not ``tests.fakes.fake_server``: that one spends a thread and a new TCP
connection per request and keeps every request body for the tests to read; at
hundreds of requests a second on a shared 2-core machine it would measure
itself. This one is a single asyncio loop with keep-alive, keeps no body, and
answers from the ``Idempotency-Key`` header (``run:lap:model``) alone, so the
answer of lap *k* of a run is the benchmark workload's (``bench.workload``),
whichever worker asks and however often.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Mapping

from bench.workload import TOOL_NAME, USAGE, lap_spec, laps_of
from tests.fakes.keepalive import serve_keepalive


def completion(key: str) -> bytes:
    """The chat completion for the lap named by ``key``."""
    run_id, lap, _ = key.rsplit(":", 2)
    spec = lap_spec(int(lap), laps_of(run_id))
    message: dict[str, object] = {"role": "assistant", "content": spec.text, "refusal": None}
    if spec.call_args is not None:
        message["tool_calls"] = [{"id": f"call_{lap}_0", "type": "function", "function": {
            "name": TOOL_NAME, "arguments": json.dumps(spec.call_args)}}]
    return json.dumps({
        "id": f"chatcmpl-{key}", "object": "chat.completion", "created": 0, "model": "io",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "stop" if spec.final else "tool_calls"}],
        "usage": {"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1],
                  "total_tokens": sum(USAGE)},
    }).encode()


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     latency: float) -> None:
    async def answer(_path: str, headers: Mapping[str, str]) -> bytes:
        await asyncio.sleep(latency)
        return completion(headers.get("idempotency-key", "x-n1-0:1:model"))

    await serve_keepalive(reader, writer, answer)


async def serve(port: int, latency: float) -> None:
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, latency),
                                        "127.0.0.1", port, backlog=2048)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"listening on 127.0.0.1:{port}, latency {latency} s", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.io_provider", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--latency", type=float, default=1.0, help="seconds before each answer")
    args = p.parse_args(argv)
    asyncio.run(serve(args.port, args.latency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
