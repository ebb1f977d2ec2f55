"""The fast streaming client: HTTP/1.1 on ``asyncio.Protocol`` (uvloop or plain asyncio).

The per-read work happens in ``data_received``, with no stream reader, future or
coroutine switch per read: one ``time.monotonic_ns()``, the chunked-coding split (a read
that holds exactly one whole chunk, what an SSE server writes per event, takes a short
path, and its event is counted where it lies in the read, ``EventStream.feed_span``), and the
SSE split, token count and two typed-array appends of ``EventStream``. The
request's coroutine wakes twice: when its connection is ready, and when the body ended.

Requests go out as one ``transport.write`` of a head built from a pre-encoded prefix per
path, plus the body. Connections are kept alive and reused per worker (most recently
used first); a response with ``Connection: close``, extra bytes or an unfinished body
closes its connection, and one idle for longer than the pool's keep-alive (``IDLE_S``, or
AIPerf's ``KEEPALIVE_S`` for AgentX runs) is closed instead of reused. A request written
into a reused connection that the server closes without a byte of response (it closed the
idle connection as the request went out) is sent again once on a new connection, its
connect time counted from its first send.

Errors map to the same kinds as the aiohttp client (``replay.client``): ``connect``
(refused, unreachable), ``timeout`` (``request_timeout_s`` from the send, connecting
included), ``http``, ``stream`` (closed mid-response, not HTTP, broken chunked coding,
error event, truncated events), ``json``, ``cancelled``. Plain ``http://`` only; https
targets use the aiohttp client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

from agent_replay.engines.kstamp import AddrInfo, StampedTransport, open_stamped, resolve
from agent_replay.redact import Scrubber
from agent_replay.replay.client import (
    EventStream,
    Failure,
    Prepared,
    SendGate,
    caught,
    clean_error,
    failure,
)
from agent_replay.replay.http1 import (
    ChunkedDecoder,
    HeadReader,
    ProtocolError,
    ResponseHead,
    request_head,
    request_head_prefix,
)
from agent_replay.replay.outcome import RequestRecord
from agent_replay.results_schema import ErrorKind

IDLE_S = 4.0
"""An idle connection older than this is closed rather than reused: servers close idle
keep-alive connections on their own (uvicorn, so vLLM, after 5 s), and a request written
into a connection the server is closing would fail."""
KEEPALIVE_S = 300.0
"""AIPerf's keep-alive (``AIPERF_HTTP_KEEPALIVE_TIMEOUT``, 300 s): an idle connection is
reused while the server keeps it open, up to this long (``--timing agentx``)."""
CONNECT_TIMEOUT_S = 10.0
ERROR_BODY = 4096
"""Bytes of a non-200 response body kept for the error message."""
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SIZES: dict[bytes, int] = {}
"""Chunk-size lines seen (hex digits only) and their values: an SSE stream repeats a few
sizes, and a lookup costs less than checking and converting the digits every chunk."""
_SIZES_KEPT = 4096

_IDLE, _HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE = range(5)


class ConnectError(Exception):
    """No connection to the target (refused, unreachable, name not resolved)."""


class ConnectionClosed(Exception):
    """The server closed the connection before the response ended; ``unanswered``: before
    a byte of it."""

    def __init__(self, message: str, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered


class H1Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    __slots__ = (
        "_aligned",
        "_chunks",
        "_error_body",
        "_head",
        "_left",
        "_rec",
        "_state",
        "_stream",
        "_waiter",
        "closed",
        "idle_since",
        "keep_alive",
        "last_t",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | StampedTransport | None = None
        self.closed = False
        self.keep_alive = True
        self.idle_since = 0
        self.last_t = 0
        self._state = _IDLE
        self._waiter: asyncio.Future[int] | None = None
        self._rec: RequestRecord | None = None
        self._stream: EventStream | None = None
        self._head = HeadReader()
        self._chunks: ChunkedDecoder | None = None
        self._aligned = False  # chunked 200 body at a chunk boundary, nothing buffered
        self._left = 0
        self._error_body: bytearray | None = None

    # -- driven by the client ----------------------------------------------------------

    def begin(self, rec: RequestRecord, stream: EventStream, waiter: asyncio.Future[int]) -> None:
        """Expect the response to the request about to be written."""
        self._rec = rec
        self._stream = stream
        self._waiter = waiter
        self._state = _HEAD
        self._head = HeadReader()
        self._chunks = None
        self._aligned = False
        self._error_body = None
        self.last_t = 0

    def error_text(self) -> str:
        return bytes(self._error_body or b"").decode("utf-8", "replace")

    def fail(self, exc: BaseException) -> None:
        """End the current response with ``exc`` and drop the connection."""
        self.keep_alive = False
        self._state = _IDLE
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def on_timeout(self) -> None:
        self.fail(asyncio.TimeoutError())

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received(data, time.monotonic_ns())

    def received(self, data: bytes, t: int) -> None:
        """``data`` read at ``t`` (the loop's time, or the kernel's receive time with
        ``engines.kstamp``)."""
        self.last_t = t
        if self._aligned:
            # The common read: whole chunks ("<hex>\r\n<data>\r\n"), usually one (an SSE
            # server writes one chunk per event), several when reads fell behind. Their
            # data goes straight to the event stream; whatever else (a partial chunk, the
            # last chunk, an extension) goes through the chunked decoder below.
            pos = 0
            n = len(data)
            feed = self._stream.feed_span  # type: ignore[union-attr]
            try:
                while True:
                    i = data.find(b"\r\n", pos) if pos else data.find(b"\r\n")
                    if not 0 < i - pos < 9:
                        break
                    size = data[pos:i]
                    length = _SIZES.get(size)
                    if length is None:
                        if not _HEX.issuperset(size):
                            break
                        length = int(size, 16)
                        if len(_SIZES) < _SIZES_KEPT:
                            _SIZES[size] = length
                    start = i + 2
                    end = start + length
                    if end == start or end + 2 > n or data[end] != 13 or data[end + 1] != 10:
                        break
                    feed(data, start, end, t)
                    pos = end + 2
                    if pos == n:
                        return
            except Exception as exc:  # classified by the client
                self.fail(exc)
                return
            if pos:
                data = data[pos:]
        try:
            self._read(data, t)
        except Exception as exc:  # classified by the client
            self.fail(exc)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost ends the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.keep_alive = False
        w = self._waiter
        if w is None or w.done():
            return
        if self._state == _UNTIL_CLOSE and exc is None:  # a clean close ends such a body
            self._complete(self.last_t or time.monotonic_ns())
        elif self._state == _HEAD:
            held = self._head.pending
            w.set_exception(
                ConnectionClosed(
                    (
                        f"the server closed the connection inside the response head ({held} bytes)"
                        if held
                        else "the server closed the connection without a response"
                    )
                    + (f" ({exc})" if exc else ""),
                    unanswered=not held,
                )
            )
        else:
            w.set_exception(
                ConnectionClosed(
                    "the server closed the connection before the end of the response"
                    + (f" ({exc})" if exc else "")
                )
            )

    # -- the response state machine ------------------------------------------------------

    def _read(self, data: bytes, t: int) -> None:
        if self._state == _HEAD:
            rest = self._read_head(data, t)
            if rest is None:
                return
            data = rest
        if self._state != _CHUNKED:
            self._read_unchunked(data, t)
            return
        # a chunked body (read by the aligned path in ``received`` when it can): inline,
        # since a server's reads can fall out of step with its frames for a whole response
        dec = self._chunks
        assert dec is not None
        pieces = dec.feed(data)
        if pieces:
            self._body(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
        if dec.done:
            if dec.extra:
                self.keep_alive = False
            self._complete(t)
        elif self._error_body is None:
            self._aligned = dec.at_boundary

    def _read_unchunked(self, data: bytes, t: int) -> None:
        """A body of a known length, or one that ends when the connection closes; bytes in
        any other state are unexpected."""
        state = self._state
        if state == _LENGTH:
            self._read_length(data, t)
        elif state == _UNTIL_CLOSE:
            self._body(data, t)
        else:
            self._unexpected()

    def _read_head(self, data: bytes, t: int) -> bytes | None:
        """The response head from ``data``; the body bytes that came with it, None when
        there are none to read (the head is not complete yet, or the response has no body)."""
        got = self._head.feed(data)
        if got is None:
            return None
        head, data = got
        self._start_body(head, t)
        if not data or self._state == _IDLE:
            if data:
                self._unexpected()
            return None
        return data

    def _read_length(self, data: bytes, t: int) -> None:
        left = self._left
        if len(data) > left:
            self.keep_alive = False
            data = data[:left]
        self._left = left - len(data)
        self._body(data, t)
        if self._left == 0:
            self._complete(t)

    def _start_body(self, head: ResponseHead, t: int) -> None:
        rec = self._rec
        assert rec is not None
        rec.headers_ns = t
        rec.http_status = head.status
        self.keep_alive = head.keep_alive
        if head.status != 200:
            self._error_body = bytearray()
        if not head.has_body:
            self._complete(t)
        elif head.chunked:
            self._chunks = ChunkedDecoder()
            self._state = _CHUNKED
            self._aligned = self._error_body is None
        elif head.content_length is not None:
            self._left = head.content_length
            self._state = _LENGTH
            if self._left == 0:
                self._complete(t)
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE

    def _body(self, data: bytes, t: int) -> None:
        err = self._error_body
        if err is None:
            self._stream.feed(data, t)  # type: ignore[union-attr]
            return
        err += data[: ERROR_BODY - len(err)]
        if len(err) >= ERROR_BODY and self._state != _IDLE:
            self.keep_alive = False  # the rest of the body is not read
            self._complete(t)

    def _complete(self, t: int) -> None:
        self._state = _IDLE
        self._aligned = False
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(t)

    def _unexpected(self) -> None:
        """Bytes when no response is expected: the connection cannot be trusted."""
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()


FAILURES: tuple[Failure, ...] = (
    (asyncio.TimeoutError, ErrorKind.TIMEOUT, "request timed out"),
    (ConnectError, ErrorKind.CONNECT, "{exc}"),
    ((ConnectionClosed, ProtocolError, OSError), ErrorKind.STREAM, "{name}: {exc}"),
    (ValueError, ErrorKind.JSON, "bad event: {exc}"),  # orjson.JSONDecodeError is one
)
"""How the fast client classifies a failed request, the first match deciding."""
CAUGHT = caught(FAILURES)
"""The failures a request records instead of raising."""


class _Attempt:
    """The connection and the timeout timer a request is using."""

    __slots__ = ("conn", "timer")

    def __init__(self) -> None:
        self.conn: H1Connection | None = None
        self.timer: asyncio.TimerHandle | None = None

    def close(self, pool: ConnectionPool) -> None:
        """Cancel the timer and give the connection back to ``pool``."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.conn is not None:
            pool.release(self.conn)
            self.conn = None


class ConnectionPool:
    """Keep-alive connections to one host:port, most recently used first."""

    def __init__(
        self, host: str, port: int, idle_s: float = IDLE_S, *, kernel_timestamps: bool = False
    ) -> None:
        self.host = host
        self.port = port
        self.kernel_timestamps = kernel_timestamps
        self._addrs: asyncio.Future[list[AddrInfo]] | None = None
        """The one lookup of host:port, shared by every connect (the first wave's connects
        all wait on it instead of each taking a thread-pool lookup)."""
        self.idle_ns = int(idle_s * 1e9)
        self._idle: list[H1Connection] = []
        self.opened = 0
        """Connections opened so far."""

    def take(self) -> H1Connection | None:
        """An idle connection to reuse, or None."""
        idle = self._idle
        if not idle:
            return None
        now = time.monotonic_ns()
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > self.idle_ns:
                if conn.transport is not None:
                    conn.transport.close()
                continue
            return conn
        return None

    async def connect(self, timeout_s: float) -> H1Connection:
        loop = asyncio.get_running_loop()
        try:
            if self.kernel_timestamps:
                if self._addrs is None or (self._addrs.done() and self._addrs.exception()):
                    self._addrs = loop.create_task(resolve(self.host, self.port))
                addrs = await asyncio.wait_for(asyncio.shield(self._addrs), timeout_s)
                conn = H1Connection()
                await asyncio.wait_for(open_stamped(addrs, conn), timeout_s)
            else:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(H1Connection, self.host, self.port), timeout_s
                )
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.opened += 1
        return conn

    def release(self, conn: H1Connection) -> None:
        """Back to the pool when it can carry another request, else closed."""
        if conn.keep_alive and not conn.closed and conn._state == _IDLE:
            conn.idle_since = time.monotonic_ns()
            conn._waiter = None
            conn._rec = None
            conn._stream = None
            self._idle.append(conn)
        else:
            conn.keep_alive = False
            if conn.transport is not None:
                conn.transport.close()

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()

    @property
    def idle(self) -> int:
        return len(self._idle)


class FastSender:
    """Sends prepared requests over a keep-alive ``ConnectionPool`` against ``base_url``
    (http only). Same interface and the same ``RequestRecord`` filling as
    ``replay.client.Sender``."""

    def __init__(
        self,
        base_url: str,
        request_timeout_s: float,
        *,
        kernel_timestamps: bool = False,
        keepalive_s: float = IDLE_S,
    ) -> None:
        u = urlsplit(base_url.rstrip("/"))
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"the fast client speaks plain http://, not {base_url!r}")
        port = u.port or 80
        self.host_header = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
        if ":" in u.hostname:  # IPv6 literal
            self.host_header = f"[{u.hostname}]" + (f":{u.port}" if u.port is not None else "")
        self.base_path = u.path
        self.pool = ConnectionPool(
            u.hostname, port, keepalive_s, kernel_timestamps=kernel_timestamps
        )
        self.timeout_s = request_timeout_s
        self.chunks = 0
        self.resent = 0
        """Requests sent again because their reused connection had been closed."""
        self.in_flight = 0
        self.gate = SendGate()
        self.scrub = Scrubber()
        self._prefix: dict[str, bytes] = {}

    async def send(self, prep: Prepared, rec: RequestRecord) -> None:
        """Send, stream to the end, fill ``rec``. Never raises except CancelledError (after
        recording the request as cancelled)."""
        now = time.monotonic_ns
        stream = EventStream(rec, prep.api)
        prefix = self._prefix.get(prep.path)
        if prefix is None:
            prefix = self._prefix[prep.path] = request_head_prefix(
                "POST", self.base_path + prep.path, self.host_header
            )
        await self.gate.admit(rec)
        self.in_flight += 1
        at = _Attempt()
        rec.sent_ns = sent = now()
        try:
            data = request_head(prefix, prep.headers, len(prep.body)) + prep.body
            conn, end = await self._exchange(at, rec, stream, data, sent)
            rec.end_ns = end
            if rec.http_status != 200:
                rec.fail(ErrorKind.HTTP, f"HTTP {rec.http_status}: {conn.error_text().strip()}")
                return
            stream.finish(end)
            self.chunks += len(rec.chunk_ns)
        except asyncio.CancelledError:
            rec.end_ns = rec.end_ns or now()
            rec.fail(ErrorKind.CANCELLED, "the run was stopped while this request was in flight")
            if at.conn is not None:
                at.conn.fail(ConnectionClosed("cancelled"))
            raise
        except CAUGHT as exc:
            rec.end_ns = now()
            rec.fail(
                *(failure(exc, FAILURES) or (ErrorKind.STREAM, f"{type(exc).__name__}: {exc}"))
            )
        finally:
            self.in_flight -= 1
            clean_error(rec, self.scrub, prep.headers)
            at.close(self.pool)

    async def _exchange(
        self, at: _Attempt, rec: RequestRecord, stream: EventStream, data: bytes, sent: int
    ) -> tuple[H1Connection, int]:
        """Write the request (sent at ``sent``) and wait for the end of its response, on a
        kept-alive connection if there is one, sent again on a new connection when the
        server had closed the kept one as the request went out: the connection and the
        response's end. ``at`` holds the connection and the timeout in use, for the caller
        to release whatever happens."""
        loop = asyncio.get_running_loop()
        at.conn = self.pool.take()
        while True:
            reused = at.conn is not None
            conn = at.conn = at.conn or await self._connect(rec, sent)
            waiter: asyncio.Future[int] = loop.create_future()
            conn.begin(rec, stream, waiter)
            at.timer = loop.call_later(
                self.timeout_s - (time.monotonic_ns() - sent) / 1e9, conn.on_timeout
            )
            conn.transport.write(data)  # type: ignore[union-attr]
            try:
                return conn, await waiter
            except ConnectionClosed as exc:
                if not (reused and exc.unanswered):
                    raise
                # a stale keep-alive connection: the server closed it as the request went out
                at.close(self.pool)
                self.resent += 1

    async def _connect(self, rec: RequestRecord, sent: int) -> H1Connection:
        """A new connection, its time kept in ``rec.connect_ns``. Connections opened together
        finish together (a max-rate wave: 256 in one loop iteration); their writes pass the
        gate again, a few per iteration, so the loop reads the other streams in between."""
        conn = await self.pool.connect(min(CONNECT_TIMEOUT_S, self.timeout_s))
        await self.gate.enter()
        rec.connect_ns = time.monotonic_ns() - sent
        return conn

    async def close(self) -> None:
        self.pool.close()
