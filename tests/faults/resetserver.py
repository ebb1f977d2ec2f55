"""A loopback server (its own thread and event loop) that starts every response as an
event stream and then resets the connection (RST: SO_LINGER 0, then abort) mid-response.
It notes when each reset was sent, so a client's detection delay can be measured."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

from tests.replay.rawserver import SSE_HEAD, chunk, events

_LINGER_0 = struct.pack("ii", 1, 0)


class ResetServer:
    def __init__(self, chunks_before_reset: int = 3) -> None:
        self.k = chunks_before_reset
        self.resets: list[int] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def __enter__(self) -> ResetServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            evs = events(self.k + 5)
            writer.write(SSE_HEAD + b"".join(chunk(e) for e in evs[: self.k]))
            await writer.drain()
            await asyncio.sleep(0.002)  # the client has read the first events
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
            self.resets.append(time.monotonic_ns())
            writer.transport.abort()
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.transport.abort()
