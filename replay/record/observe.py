"""Watching a response go by: the bytes the client gets, and what the trace learns from a
copy of them. Sans-I/O: fed bytes and monotonic nanosecond times by the proxy.

* Streams (``text/event-stream``) are split into SSE events; each event's output tokens are
  counted with the dialect decoders of ``engines.dialects`` (exact from ``token_ids`` or
  continuous usage; otherwise the chunk is known to carry tokens but not how many).
* When the proxy injected ``include_usage``, the final usage chunk is cut from the client's
  bytes (and, for servers that add ``"usage":null`` to every chunk once usage is on, that
  field too). Nothing else is ever changed.
* Compressed bodies pass through as sent; a decompressed copy is parsed (gzip, deflate).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import orjson

from agent_replay.engines.dialects import dialect
from agent_replay.engines.sse import SSEEvent, SSEParser

_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class RawEventSplitter:
    """Splits an SSE byte stream into the raw bytes of whole events (terminator included),
    so that an event can be forwarded or dropped as a unit, byte for byte."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        start = 0
        while True:
            m = _BLANK_LINE.search(buf, start)
            if m is None:
                break
            end = m.end()
            if end == len(buf) and buf.endswith(b"\r"):
                break  # maybe the first half of a CRLF: wait for the next bytes
            out.append(buf[start:end])
            start = end
        self._buf = buf[start:]
        return out

    def rest(self) -> bytes:
        """Bytes of an unfinished event at the end of the stream."""
        rest, self._buf = self._buf, b""
        return rest


def _decompressor(encoding: str) -> Any | None:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise ValueError(enc)


class ResponseObserver:
    """One response. Call ``start`` with the status and headers, ``feed`` with every read
    (returns the bytes to forward now; or ``forward`` now and ``observe`` later, in order),
    ``end`` at the end of the body (returns the last bytes to forward). Then read the
    attributes."""

    def __init__(self, api: str, *, injected_usage: bool, uncached_input: bool = False) -> None:
        self.api = api
        self.uncached_input = uncached_input
        self.injected_usage = injected_usage
        self.status = 0
        self.streamed = False
        self.filtering = False
        self.token_times: list[int] = []
        """Monotonic ns of every read that completed an event carrying output tokens."""
        self.token_counts: list[int] = []
        self.exact = True
        self.events: list[SSEEvent] = []
        """The stream's events, for reading the reply after the fact."""
        self.body = bytearray()
        """The decoded body of a response that is not a stream."""
        self.bytes_in = 0
        self.bytes_out = 0
        self.parse_error: str | None = None
        self.stream_error: str | None = None
        self.malformed = 0
        """Events that could not be decoded (skipped; ``stream_error`` says so)."""
        self._first_malformed = ""
        self._parser = SSEParser()
        self._splitter: RawEventSplitter | None = None
        self._decomp: Any | None = None
        self._decoder: Any = None
        self._parse = True

    def start(
        self, status: int, content_type: str, content_encoding: str, content_length: int | None
    ) -> None:
        self.status = status
        self.streamed = content_type.split(";")[0].strip().lower() == "text/event-stream"
        try:
            self._decomp = _decompressor(content_encoding)
        except ValueError:
            self._parse = False
            self.parse_error = f"content-encoding {content_encoding!r} not decoded"
        if self.streamed:
            self._decoder = dialect(self.api).decoder()
            self.filtering = (
                self.injected_usage
                and self._decomp is None
                and self._parse
                and content_length is None
            )
            if self.filtering:
                self._splitter = RawEventSplitter()

    def feed(self, data: bytes, t_ns: int) -> bytes:
        out = self.forward(data)
        self.observe(data, t_ns)
        return out

    def forward(self, data: bytes) -> bytes:
        """The part of ``feed`` that decides what the client gets now: cheap, so that a
        proxy can send it before it spends time on ``observe``."""
        self.bytes_in += len(data)
        out = self._forward(data)
        self.bytes_out += len(out)
        return out

    def observe(self, data: bytes, t_ns: int) -> None:
        """The other part of ``feed``: parse a copy of ``data``, read at ``t_ns``. Calls
        must come in the order of the reads, all before ``end``."""
        if self._parse:
            try:
                self._observe(self._decomp.decompress(data) if self._decomp else data, t_ns)
            except (
                zlib.error,
                orjson.JSONDecodeError,
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
            ) as exc:
                self._parse = False
                self.parse_error = f"unparsable response: {type(exc).__name__}: {exc}"[:200]

    def end(self, t_ns: int) -> bytes:
        out = b""
        if self._splitter is not None:
            out = self._splitter.rest()
            self.bytes_out += len(out)
        if self._parse and self.streamed:
            events, rest = self._parser.end()
            for ev in events:
                self._event(ev, t_ns)
            if rest:
                self.stream_error = "stream ended inside an event"
        return out

    # -- internals ---------------------------------------------------------------------

    def _forward(self, data: bytes) -> bytes:
        if self._splitter is None:
            return data
        kept = [e for e in self._splitter.feed(data) if not _is_extra_usage(e)]
        out = b"".join(kept)
        if b'"usage":null' in out:
            out = out.replace(b',"usage":null', b"").replace(b'"usage":null,', b"")
        return out

    def _observe(self, data: bytes, t_ns: int) -> None:
        if not self.streamed:
            self.body += data
            return
        for ev in self._parser.feed(data):
            self._event(ev, t_ns)

    def _event(self, ev: SSEEvent, t_ns: int) -> None:
        if not ev.data:
            return
        dec = self._decoder
        try:
            k = dec.feed(ev.data, ev.event)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            # One bad event is recorded as such; the events around it still count.
            self.malformed += 1
            if self.malformed == 1:
                self._first_malformed = f"{type(exc).__name__}: {exc}"[:160]
            self.stream_error = (
                f"malformed event from the upstream ({self.malformed} in "
                f"all; first: {self._first_malformed})"
            )
            return
        self.events.append(ev)
        if k > 0:
            self.token_times.append(t_ns)
            self.token_counts.append(k)

    # -- results -----------------------------------------------------------------------

    def usage(self) -> tuple[int | None, int | None, int | None]:
        """(prompt tokens, output tokens, cached tokens) as the server reported them."""
        if self.streamed:
            if self._decoder is None:
                return None, None, None
            return dialect(self.api).stream_usage(self._decoder, self.uncached_input)
        return dialect(self.api).response_usage(self.json_body(), self.uncached_input)

    def finished(self) -> bool:
        """A stream whose end event was seen (and forwarded: ``observe`` follows
        ``forward``)."""
        dec = self._decoder
        return bool(self.streamed and dec is not None and dec.done and self._parse)

    def exact_counts(self) -> bool:
        dec = self._decoder
        return bool(
            self.streamed and dec is not None and dec.exact and self._parse and not self.malformed
        )

    def json_body(self) -> Any:
        """The parsed body of a non-stream response (None when it is not JSON)."""
        if self.streamed or not self.body:
            return None
        try:
            return orjson.loads(bytes(self.body))
        except orjson.JSONDecodeError:
            return None

    def server_error(self) -> str | None:
        """An error the server reported in the body or stream, shortened."""
        if self.streamed:
            err = getattr(self._decoder, "error", None)
            return str(err)[:200] if err else None
        obj = self.json_body()
        if isinstance(obj, dict) and obj.get("error"):
            err = obj["error"]
            if isinstance(err, dict):
                return str(err.get("type") or err.get("code") or "error")[:200]
            return str(err)[:200]
        return None


def _is_extra_usage(event: bytes) -> bool:
    """The final usage chunk of an OpenAI stream: no choices, a usage object."""
    if b'"usage"' not in event or b'"choices"' not in event:
        return False
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                obj = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                return False
            return (
                isinstance(obj, dict)
                and obj.get("choices") == []
                and isinstance(obj.get("usage"), dict)
            )
    return False
