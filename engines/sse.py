"""A sans-I/O parser for Server-Sent Events (the WHATWG ``text/event-stream`` format).

Feed it bytes as they arrive, in any split; it returns the complete events. It knows
nothing about sockets or clocks, so the recorder, the replay client and the tests share it.
"""

from __future__ import annotations

from typing import NamedTuple


class SSEEvent(NamedTuple):
    event: str | None
    """The ``event:`` field (Anthropic's ``message_start`` etc.), None for plain ``data:``."""
    data: bytes
    """The ``data:`` lines joined by ``\\n`` (the JSON payload, or ``b"[DONE]"``)."""


class SSEParser:
    """Incremental SSE parser.

    ``feed`` returns the events completed by the new bytes. Comment lines (``: keep-alive``)
    are counted in ``comments``. ``end`` returns what the end of the stream completes and
    the bytes of an event left unfinished (empty when the stream ended cleanly).
    """

    __slots__ = ("_buf", "comments")

    def __init__(self) -> None:
        self._buf = b""
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A CR at the very end may be the first half of CRLF: keep it for the next read.
            tail = b""
            if buf.endswith(b"\r"):
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            parts = buf.split(b"\n\n")
            self._buf = parts.pop() + tail
        else:
            parts = buf.split(b"\n\n")
            self._buf = parts.pop()
        if not parts:
            return []
        out: list[SSEEvent] = []
        for block in parts:
            if block.startswith(b"data: ") and b"\n" not in block:
                out.append(SSEEvent(None, block[6:]))  # the common case: one data line
                continue
            ev = self._parse_block(block)
            if ev is not None:
                out.append(ev)
        return out

    def _parse_block(self, block: bytes) -> SSEEvent | None:
        event: str | None = None
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if not line:
                continue
            if line[0] == 0x3A:  # ":" comment
                self.comments += 1
                continue
            name, sep, value = line.partition(b":")
            if sep and value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value.decode("utf-8", "replace")
            # "id" and "retry" carry nothing we use
        if not data and event is None:
            return None
        return SSEEvent(event, b"\n".join(data))

    def end(self) -> tuple[list[SSEEvent], bytes]:
        """End of stream: events completed only by it (a held-back final CR), and the
        unfinished remainder (b"" after a clean end, else a truncated event)."""
        events: list[SSEEvent] = []
        if self._buf.endswith(b"\r"):
            self._buf = self._buf[:-1]
            events = self.feed(b"\n")
        rest, self._buf = self._buf.strip(b"\r\n"), b""
        return events, rest


def encode_event(data: bytes, event: str | None = None) -> bytes:
    """One SSE event as a server writes it."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
