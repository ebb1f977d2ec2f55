"""The client's side of a forwarded response: its body written at the client's transport
(``ClientBody``), and ``ClientGone``, raised when the client has gone away."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web


class ClientGone(Exception):
    """The client connection is closed; nothing more to send."""


class ClientBody:
    """The body of a response to the client, written straight to its transport.

    aiohttp's ``StreamResponse`` writes the head (status, headers, keep-alive, and the
    framing: the upstream's ``Content-Length``, else chunked for HTTP/1.1, else the end of
    the connection); the body bypasses its per-write machinery (a coroutine, length and
    compression bookkeeping per chunk): every upstream read becomes one ``transport.write``
    (framed as one chunk when chunked), and the writer waits only while the transport is
    above its high-water mark (the client reads slower than the upstream sends). A client
    that is gone raises ``ClientGone``, so that it is not mistaken for an upstream
    failure."""

    __slots__ = ("_chunked", "_left", "_protocol", "_transport", "_writer", "response")

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.response = response
        writer = request.writer
        writer.send_headers()  # now: the client sees the upstream's answer start
        self._writer = writer
        self._transport = request.transport
        self._protocol: Any = getattr(writer, "protocol", None)
        self._chunked = bool(getattr(writer, "chunked", False))
        empty = request.method == "HEAD" or response.status in (204, 304) or response.status < 200
        self._left: int | None = (
            0 if empty else (None if self._chunked else response.content_length)
        )
        """Bytes the declared length still allows (None: no limit)."""

    def write(self, data: bytes) -> bool:
        """Send ``data`` now; True when the client is not keeping up (then ``drain``)."""
        if not data:
            return False
        left = self._left
        if left is not None:
            if len(data) > left:  # never more than the head declared
                data = data[:left]
                if not data:
                    return False
            self._left = left - len(data)
        elif self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ClientGone
        transport.write(data)
        protocol = self._protocol
        return protocol is None or bool(protocol.writing_paused)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone from exc

    async def end(self) -> None:
        """End the body (the last chunk when chunked; keep-alive is aiohttp's)."""
        try:
            await self.response.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone from exc
