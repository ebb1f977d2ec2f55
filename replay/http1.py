"""HTTP/1.1 on the wire for the fast client, without I/O: the request head, the response
head, and the body framings (chunked transfer coding, Content-Length, until close).

Pure state machines fed with bytes, so the tests can split a response at every byte.
``replay.fastclient`` is the socket adapter around them.
"""

from __future__ import annotations

from collections.abc import Mapping

MAX_HEAD = 65536
"""A response head longer than this is not HTTP from an LLM server: a protocol error."""
MAX_LINE = 4096
"""Longest chunk-size or trailer line accepted."""
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.x response."""


def request_head_prefix(method: str, path: str, host: str) -> bytes:
    """The start of a request head that is the same for every request to ``path``: the
    request line, Host and Accept. The per-request headers and Content-Length follow."""
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n".encode("latin-1")


def request_head(prefix: bytes, headers: Mapping[str, str], content_length: int) -> bytes:
    """A complete request head: ``prefix``, ``headers`` (no Host, Content-Length or
    Transfer-Encoding among them) and Content-Length. Raises ``ProtocolError`` for a header
    that cannot be sent as it is (CR or LF inside, characters outside ISO-8859-1)."""
    lines = [f"{k}: {v}\r\n" for k, v in headers.items()]
    fields = "".join(lines)
    if fields.count("\r") != len(lines) or fields.count("\n") != len(lines):
        # a CR or LF inside a name or value would end the field there
        bad = next(line for line in lines if line.count("\r") + line.count("\n") > 2)
        raise ProtocolError(f"header {bad[:60]!r} contains CR or LF: not sent")
    try:
        raw = fields.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"header value not encodable as ISO-8859-1: {exc}") from None
    return b"%s%sContent-Length: %d\r\n\r\n" % (prefix, raw, content_length)


class ResponseHead:
    """A parsed status line and header block."""

    __slots__ = (
        "chunked",
        "content_length",
        "headers",
        "keep_alive",
        "reason",
        "status",
        "version",
    )

    def __init__(
        self, version: str, status: int, reason: str, headers: list[tuple[str, str]]
    ) -> None:
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers
        """(lower-case name, value) in the order received."""
        self.chunked = False
        self.content_length: int | None = None
        conn = ""
        for name, value in headers:
            if name == "transfer-encoding":
                # chunked is the last coding when present (RFC 9112 6.1)
                self.chunked = value.replace(" ", "").lower().split(",")[-1] == "chunked"
            elif name == "content-length":
                v = value.strip()
                if not v.isdigit():
                    raise ProtocolError(f"bad Content-Length {value!r}")
                n = int(v)
                if self.content_length is not None and self.content_length != n:
                    raise ProtocolError("conflicting Content-Length headers")
                self.content_length = n
            elif name == "connection":
                conn = value.lower()
        if self.chunked:
            self.content_length = None  # Transfer-Encoding wins (RFC 9112 6.3)
        if version == "HTTP/1.0":
            self.keep_alive = "keep-alive" in conn
        else:
            self.keep_alive = "close" not in conn

    @property
    def has_body(self) -> bool:
        return not (self.status < 200 or self.status in (204, 304))

    @property
    def until_close(self) -> bool:
        """The body ends when the server closes the connection."""
        return self.has_body and not self.chunked and self.content_length is None


def parse_head(raw: bytes) -> ResponseHead:
    """Parse a response head (status line and headers, without the blank line)."""
    lines = raw.split(b"\r\n")
    status_line = lines[0]
    parts = status_line.split(b" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(parts[1]) != 3
        or not parts[1].isdigit()
    ):
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
    return ResponseHead(
        parts[0].decode(),
        int(parts[1]),
        parts[2].decode("latin-1") if len(parts) > 2 else "",
        headers,
    )


class HeadReader:
    """Collects bytes until the blank line that ends a response head.

    ``feed`` returns None while the head is incomplete, else (head, the bytes after it).
    Interim 1xx responses (100 Continue) are skipped.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> tuple[ResponseHead, bytes] | None:
        buf = self._buf + data if self._buf else data
        while True:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > MAX_HEAD:
                    raise ProtocolError(f"no end of the response head in {len(buf)} bytes")
                self._buf = buf
                return None
            head = parse_head(buf[:i])
            buf = buf[i + 4 :]
            if 100 <= head.status < 200:
                continue
            self._buf = b""
            return head, buf

    @property
    def pending(self) -> int:
        """Bytes of an unfinished head held."""
        return len(self._buf)


_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Decodes the chunked transfer coding incrementally.

    ``feed`` returns the chunk data the new bytes complete or continue (a chunk split over
    reads comes out in pieces, as it arrives), and raises ``ProtocolError`` on anything
    that is not chunked coding. ``done`` is set by the last chunk and its trailer; bytes
    after that are in ``extra``. Chunk extensions and trailer fields are skipped.
    """

    __slots__ = ("_buf", "_left", "_state", "extra")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0
        self._state = _SIZE
        self.extra = b""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def at_boundary(self) -> bool:
        """Between chunks with nothing buffered: the next byte starts a chunk-size line."""
        return self._state == _SIZE and not self._buf

    def feed(self, data: bytes) -> list[bytes]:
        if self._state == _DONE:
            self.extra += data
            return []
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        state = self._state
        while pos < n:
            if state == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    state = _DATA_END
            elif state == _SIZE:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if n - pos > MAX_LINE:
                        raise ProtocolError("chunk-size line too long")
                    break
                line = buf[pos:i]
                size_field = line.split(b";", 1)[0].rstrip(b" \t")
                if not size_field or not _HEX.issuperset(size_field) or len(size_field) > 15:
                    raise ProtocolError(f"bad chunk-size line {line[:40]!r}")
                pos = i + 2
                self._left = int(size_field, 16)
                state = _DATA if self._left else _TRAILER
            elif state == _DATA_END:
                if n - pos < 2:
                    if buf[pos:] != b"\r":
                        raise ProtocolError("chunk data not followed by CRLF")
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _TRAILER:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if n - pos > MAX_LINE:
                        raise ProtocolError("trailer line too long")
                    break
                end = i == pos
                pos = i + 2
                if end:
                    state = _DONE
                    self.extra = buf[pos:]
                    pos = n
        self._state = state
        self._buf = buf[pos:] if pos < n else b""
        return out
