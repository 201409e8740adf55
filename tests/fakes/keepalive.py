"""One connection's HTTP/1.1 keep-alive exchanges on asyncio, for loopback
model providers that hold hundreds of connections at little cost: the IO-bound
benchmark's provider (``bench.io_provider``) and the model clients'
connection test (``tests/unit/test_model_connections.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

#: Given a request's path and headers (names in lower case), its JSON answer.
Answer = Callable[[str, Mapping[str, str]], Awaitable[bytes]]


async def serve_keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          answer: Answer) -> None:
    """Answer each request on this connection with ``answer`` (200, JSON),
    its body read and dropped, until the client closes the connection."""
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip()
                       for name, _, value in (line.partition(":") for line in head[1:])}
            await reader.readexactly(int(headers.get("content-length") or 0))
            body = await answer(head[0].split()[1], headers)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


__all__ = ["Answer", "serve_keepalive"]
