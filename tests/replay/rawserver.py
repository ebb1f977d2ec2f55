"""A loopback HTTP server that answers with scripted bytes, for the client's edge cases:
it reads each request (head + Content-Length body), records it, and plays the script the
test gives for that request: bytes to write, pauses, or closing the connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

Step = bytes | float | str
"""bytes: written (and drained); float: a pause in seconds; "close": close the connection;
"hold": keep the connection open without answering until the server stops."""


@dataclass
class Received:
    connection: int
    head: bytes
    body: bytes
    at_ns: int = 0
    """monotonic_ns when the server had read the whole request."""


@dataclass
class RawServer:
    script: Callable[[int, Received], list[Step]]
    """(index of the request, the request) -> the steps that answer it."""
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    _server: asyncio.Server | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._stop.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                got = Received(conn, head, body, time.monotonic_ns())
                self.received.append(got)
                for step in self.script(len(self.received) - 1, got):
                    if isinstance(step, bytes):
                        writer.write(step)
                        await writer.drain()
                    elif isinstance(step, float):
                        await asyncio.sleep(step)
                    elif step == "close":
                        return
                    elif step == "hold":
                        await self._stop.wait()
                        return
        except ConnectionError:
            return
        finally:
            writer.close()


def events(n_out: int, n_in: int = 40, tokens_per_chunk: int = 1) -> list[bytes]:
    """A vLLM completions stream with token ids and continuous usage, as SSE events."""
    out = []
    done = 0
    while done < n_out:
        k = min(tokens_per_chunk, n_out - done)
        done += k
        ev = {
            "id": "x",
            "choices": [
                {"index": 0, "text": " w" * k, "token_ids": list(range(k)), "finish_reason": None}
            ],
            "usage": {
                "prompt_tokens": n_in,
                "completion_tokens": done,
                "total_tokens": n_in + done,
            },
        }
        out.append(b"data: " + orjson.dumps(ev) + b"\n\n")
    usage = {
        "prompt_tokens": n_in,
        "completion_tokens": done,
        "total_tokens": n_in + done,
        "prompt_tokens_details": {"cached_tokens": 16},
    }
    out.append(b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


LAST_CHUNK = b"0\r\n\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunked_response(evs: list[bytes], head: bytes = SSE_HEAD) -> bytes:
    return head + b"".join(chunk(e) for e in evs) + LAST_CHUNK
