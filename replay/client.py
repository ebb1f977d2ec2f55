"""The streaming HTTP client on aiohttp (``--http-client aiohttp``, and https targets), and
what it shares with the default fast client (``replay.fastclient``): ``Prepared``, the
``SendGate`` and ``EventStream``, the per-read work and the end-of-stream checks, so both
fill a ``RequestRecord`` the same way.

Per chunk the work is: one ``time.monotonic_ns()`` per read, the SSE split, the token
count (``engines.dialects``: a byte search, no JSON parse when token ids are present) and
two typed-array appends. Everything else (errors, usage, mismatch) is done once per
request. No retries: a retry is a different workload.

Errors are classified into ``connect``, ``http``, ``timeout``, ``stream`` (broken or
truncated stream, error event), ``json`` (an event that is not JSON), ``empty`` (a whole
answer without a token where the trace asks for tokens) and ``cancelled`` (the run was
stopped while the request was in flight), recorded, and the run goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from agent_replay.engines.dialects import Decoder, dialect
from agent_replay.engines.sse import SSEParser
from agent_replay.redact import Scrubber, header_secrets
from agent_replay.replay.outcome import ERROR_CHARS, RequestRecord
from agent_replay.results_schema import ErrorKind, ErrorKindName


@dataclass(slots=True)
class Prepared:
    """A request ready to go: path, body bytes and headers."""

    path: str
    body: bytes
    headers: dict[str, str]
    api: str


async def _connected(_session: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
    """A new connection is open for the request whose record is the trace context."""
    rec = ctx.trace_request_ctx
    if isinstance(rec, RequestRecord) and rec.sent_ns is not None:
        rec.connect_ns = time.monotonic_ns() - rec.sent_ns


def make_session(
    request_timeout_s: float,
    limit: int = 0,
    *,
    headers: Mapping[str, str] | None = None,
    insecure: bool = False,
    keepalive_s: float | None = None,
) -> aiohttp.ClientSession:
    """The replay's aiohttp session: no connection limit, and a trace hook that records how
    long a request waited for a new connection (``RequestRecord.connect_ns``). ``headers``
    go with every request (the credentials); ``insecure`` accepts any TLS certificate;
    ``keepalive_s``: how long an idle connection is kept for reuse (None: aiohttp's 15 s)."""
    extra: dict[str, Any] = {} if keepalive_s is None else {"keepalive_timeout": keepalive_s}
    connector = aiohttp.TCPConnector(
        limit=limit, ttl_dns_cache=300, enable_cleanup_closed=True, ssl=not insecure, **extra
    )
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10.0)
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(_connected)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        json_serialize=lambda o: orjson.dumps(o).decode(),
        trace_configs=[trace],
        headers=dict(headers or {}),
    )


START_BURST = 8
"""Request starts let through per event-loop iteration: one per iteration stretches a
wave's schedule lag, unlimited holds every stream's reads back for the whole wave; 8 sits
between the two (benchmarks/journal/2026-11-29-client-performance.md, "start gate")."""


class SendGate:
    """At most ``per_iteration`` request starts per event-loop iteration, in arrival order.

    Starting a request (request set-up and the write) costs loop time. When many requests
    become due in the same iteration (a max-rate wave, a burst of simultaneous arrivals),
    starting them all in that iteration would hold every stream's reads back for the whole
    burst, and each early request's first
    chunk would be time-stamped after the later requests' set-up. Through the gate the
    starts go a few per iteration, in arrival order, with the loop polling sockets between
    them: chunk timestamps stay true, and the queueing shows where it belongs, as the
    later requests' schedule lag (the send time is stamped after the gate).
    """

    def __init__(self, per_iteration: int = START_BURST) -> None:
        if per_iteration < 1:
            raise ValueError(f"per_iteration must be >= 1, got {per_iteration}")
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._passed = 0  # starts let through for the current iteration
        self._armed = False  # a _next is scheduled
        self.per_iteration = per_iteration

    async def enter(self) -> None:
        if not self._waiters and self._passed < self.per_iteration:
            self._passed += 1
            self._arm()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._arm()
        await fut

    async def admit(self, rec: RequestRecord) -> None:
        """``enter`` for one request; a run stopped while it waits records the request as
        cancelled before it was sent."""
        try:
            await self.enter()
        except asyncio.CancelledError:
            rec.end_ns = time.monotonic_ns()
            rec.fail(ErrorKind.CANCELLED, "the run was stopped before this request was sent")
            raise

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._next)

    def _next(self) -> None:
        self._armed = False
        self._passed = 0
        while self._waiters and self._passed < self.per_iteration:
            fut = self._waiters.popleft()
            if not fut.done():  # a cancelled waiter gives its turn away
                fut.set_result(None)
                self._passed += 1
        if self._passed or self._waiters:
            self._arm()


class Sender:
    """Sends prepared requests on one aiohttp session against ``base_url``; the per-read
    work is ``EventStream.feed`` after each ``readany()``."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.chunks = 0
        self.in_flight = 0
        self._urls: dict[str, URL] = {}
        self.gate = SendGate()
        self.scrub = Scrubber(header_secrets(session.headers.items()))

    async def send(self, prep: Prepared, rec: RequestRecord) -> None:
        """Send, stream to the end, fill ``rec``. Never raises except CancelledError (after
        recording the request as cancelled)."""
        now = time.monotonic_ns
        url = self._urls.get(prep.path)
        if url is None:  # parse once: yarl parsing is per-request work otherwise
            url = self._urls[prep.path] = URL(self.base_url + prep.path)
        stream = EventStream(rec, prep.api)
        feed = stream.feed
        await self.gate.admit(rec)
        self.in_flight += 1
        rec.sent_ns = now()
        try:
            async with self.session.post(
                url, data=prep.body, headers=prep.headers, trace_request_ctx=rec
            ) as resp:
                rec.headers_ns = now()
                rec.http_status = resp.status
                if resp.status != 200:
                    text = (await resp.content.read(4096)).decode("utf-8", "replace")
                    rec.end_ns = now()
                    rec.fail(ErrorKind.HTTP, f"HTTP {resp.status}: {text.strip()}")
                    return
                rec.end_ns = await _read_body(resp, feed)
            stream.finish(rec.end_ns)
            self.chunks += len(rec.chunk_ns)
        except asyncio.CancelledError:
            rec.end_ns = rec.end_ns or now()
            rec.fail(ErrorKind.CANCELLED, "the run was stopped while this request was in flight")
            raise
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError) as exc:
            rec.end_ns = now()
            rec.fail(*(failure(exc, FAILURES) or _client_error(exc, rec)))
        finally:
            self.in_flight -= 1
            clean_error(rec, self.scrub, prep.headers)


async def _read_body(resp: aiohttp.ClientResponse, feed: Callable[[bytes, int], None]) -> int:
    """Feed every read of the body with its time; the time of the last (or now, for an
    empty body)."""
    now = time.monotonic_ns
    unwatch = fail_payload_on_close(resp, "response broken")
    content = resp.content
    t = 0
    try:
        while True:
            data = await content.readany()
            if not data:
                break
            t = now()
            feed(data, t)
    finally:
        unwatch()
    return t or now()


Failure = tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorKindName, str]
"""An exception class (or classes), the error kind of a request that raised it, and the
error's text (``{name}``: the class's name, ``{exc}``: the exception's)."""

FAILURES: tuple[Failure, ...] = (
    (asyncio.TimeoutError, ErrorKind.TIMEOUT, "request timed out"),
    (aiohttp.ClientConnectorError, ErrorKind.CONNECT, "{exc}"),
    (
        (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError),
        ErrorKind.STREAM,
        "{name}: {exc}",
    ),
    (ValueError, ErrorKind.JSON, "bad event: {exc}"),  # orjson.JSONDecodeError is one
)
"""How the aiohttp client classifies a failed request, the first match deciding."""


def failure(exc: BaseException, table: Sequence[Failure]) -> tuple[ErrorKindName, str] | None:
    """The error kind and text of a request that raised ``exc``: the first entry of
    ``table`` it is an instance of; None when none matches."""
    for types, kind, text in table:
        if isinstance(exc, types):
            return kind, text.format(name=type(exc).__name__, exc=exc)
    return None


def caught(table: Sequence[Failure]) -> tuple[type[BaseException], ...]:
    """Every exception class of ``table``, for an ``except`` clause."""
    return tuple(
        t for types, _, _ in table for t in (types if isinstance(types, tuple) else (types,))
    )


def _client_error(exc: BaseException, rec: RequestRecord) -> tuple[ErrorKindName, str]:
    """Any other aiohttp error: a connect error before the response head, else a stream error."""
    return (
        ErrorKind.CONNECT if rec.headers_ns is None else ErrorKind.STREAM,
        f"{type(exc).__name__}: {exc}",
    )


def clean_error(rec: RequestRecord, scrub: Scrubber, headers: Mapping[str, str]) -> None:
    """``rec.error`` (text from the wire: an error body, an error event, an exception
    message) without any of the values the request was sent with, cut to
    ``ERROR_CHARS``. The counts problems (``mismatch``, ``inexact``) are the client's own
    words and are left alone."""
    if rec.error and rec.error_kind not in (ErrorKind.MISMATCH, ErrorKind.INEXACT):
        rec.error = scrub(rec.error, headers)[:ERROR_CHARS]


def _nothing() -> None:
    return None


def fail_payload_on_close(
    resp: aiohttp.ClientResponse, prefix: str = "upstream response broken"
) -> Callable[[], None]:
    """End ``resp``'s body with an error when its connection closes before the body ended.

    aiohttp's client closes the connection on a response it cannot parse (broken chunked
    coding) but leaves the body's reader waiting (until its timeout, 600 s by default):
    a replay request, or the client behind the recorder, would hang that long, and the
    error would say whatever ended it. This ends the body at once with a
    ``ClientPayloadError`` whose text starts with ``prefix`` and says what broke.

    Returns the function that takes the watch off again, to call when the body has ended:
    a kept-alive connection carries many responses, and their watches would pile up on it."""
    conn = resp.connection
    closed = conn.protocol.closed if conn is not None and conn.protocol is not None else None
    if closed is None:
        return _nothing
    proto = conn.protocol  # type: ignore[union-attr]
    content = resp.content

    def on_closed(fut: asyncio.Future[None]) -> None:
        if content.is_eof() or content.exception() is not None:
            return
        why = proto.exception() if proto is not None else None
        if why is None and not fut.cancelled():
            why = fut.exception()
        detail = " ".join(str(why).split()) if why else "connection closed mid-body"
        content.set_exception(aiohttp.ClientPayloadError(f"{prefix}: {detail}"))

    closed.add_done_callback(on_closed)

    def unwatch() -> None:
        closed.remove_done_callback(on_closed)

    return unwatch


class EventStream:
    """One response body's events into its record: the per-read work both clients share.

    ``feed(data, t)`` takes the body bytes of one read and its ``monotonic_ns`` time: the
    SSE split, the token count and, for every event that carried output tokens, one append
    to each of the record's typed arrays. ``finish(end_ns)`` runs once at the end of the
    body: the events only the end completes, usage, and the stream checks (error event,
    truncation, end marker, counts against the trace; a stream without exact tokens per
    chunk stays ``ok`` with error_kind ``inexact``). ``feed`` raises
    ``orjson.JSONDecodeError``/``ValueError`` on an event that is not JSON (the caller
    classifies it as ``json``).
    """

    __slots__ = ("_clean", "_dec", "_feed", "_parser", "_rec", "_span", "_tok", "_ts", "_typed")

    def __init__(self, rec: RequestRecord, api: str) -> None:
        self._rec = rec
        self._ts = rec.chunk_ns
        self._tok = rec.chunk_tokens
        self._parser = SSEParser()
        d = dialect(api)
        self._typed = d.typed_events  # events named by an ``event:`` line
        self._dec: Decoder = d.decoder()
        self._feed = self._dec.feed
        self._span: Any = None if self._typed else getattr(self._dec, "count_span", None)
        """The decoder's count of one event inside a larger buffer (``count_span(data,
        start, end)``, -1 when it cannot count that event without ``feed``), if it has one."""
        self._clean = True  # the SSE parser holds no partial event

    def feed_span(self, data: bytes, start: int, end: int, t: int) -> None:
        """``feed(data[start:end], t)``: the body bytes of a read that sit inside a larger
        buffer (a chunked frame). The common read, one single-line event whose tokens the
        decoder counts in place, is not copied out of ``data``."""
        span = self._span
        if (
            span is not None
            and self._clean
            and data[start : start + 6] == b"data: "
            and data.find(b"\n", start) == end - 2
            and data[end - 1] == 10
        ):
            k = span(data, start + 6, end - 2)
            if k < 0:
                k = self._feed(data[start + 6 : end - 2])
            if k:
                self._ts.append(t)
                self._tok.append(k)
            return
        self.feed(data[start:end], t)

    def feed(self, data: bytes, t: int) -> None:
        if (
            self._clean
            and not self._typed
            and data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data[-1] == 10
        ):
            # Exactly one single-line event in this read, the common case: what
            # SSEParser would return, without its bookkeeping.
            k = self._feed(data[6:-2])
            if k:
                self._ts.append(t)
                self._tok.append(k)
            return
        feed = self._feed
        typed = self._typed
        for ev in self._parser.feed(data):
            k = feed(ev.data, ev.event) if typed else feed(ev.data)
            if k:
                self._ts.append(t)
                self._tok.append(k)
        # Ending on a blank line with no CR (a CR at the end may be half of a CRLF the
        # parser keeps) leaves the parser empty.
        self._clean = data.endswith(b"\n\n") and b"\r" not in data

    def finish(self, end_ns: int) -> None:
        rec = self._rec
        dec = self._dec
        feed = self._feed
        events, rest = self._parser.end()
        for ev in events:
            k = feed(ev.data, ev.event) if self._typed else feed(ev.data)
            if k:
                self._ts.append(end_ns)
                self._tok.append(k)
        if rec.chunk_ns:
            rec.first_token_ns = rec.chunk_ns[0]
        rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens = dec.result_usage()
        _check_stream(rec, dec, rest)


def _check_stream(rec: RequestRecord, dec: Decoder, rest: bytes) -> None:
    """The stream's checks once it ended, the first that fails deciding: an error event,
    an event left unfinished, no end marker, no output token, then the counts."""
    if dec.error is not None:
        rec.fail(ErrorKind.STREAM, f"error event: {dec.error}")
    elif rest:
        rec.fail(ErrorKind.STREAM, f"stream ended inside an event ({len(rest)} bytes left)")
    elif not dec.done:
        rec.fail(ErrorKind.STREAM, "stream ended without its end marker")
    elif _empty(rec, dec.exact):
        rec.fail(
            ErrorKind.EMPTY,
            f"HTTP {rec.http_status or 200} with no output token; "
            f"the trace asks for {rec.expected_output_tokens}",
        )
    elif not dec.exact:
        _check_inexact(rec)
    else:
        _check_counts(rec)


def _empty(rec: RequestRecord, exact: bool) -> bool:
    """A whole answer without a token where the trace asks for some. The stream's count
    decides; an inexact stream (one token per content event) with no content event is
    empty unless its usage says it served tokens."""
    if rec.expected_output_tokens <= 0 or rec.output_tokens > 0:
        return False
    return exact or not rec.completion_tokens


def _check_counts(rec: RequestRecord) -> None:
    """Compare what the server said it served with what the trace asked for. A mismatch
    keeps status ``ok`` (the request was served) with error_kind ``mismatch``."""
    counted = sum(rec.chunk_tokens)
    problems = []
    if rec.completion_tokens is not None and rec.completion_tokens != counted:
        problems.append(
            f"usage says {rec.completion_tokens} output tokens, chunks carried {counted}"
        )
    if counted != rec.expected_output_tokens:
        problems.append(f"{counted} output tokens, trace has {rec.expected_output_tokens}")
    problems += _prompt_problem(rec)
    if problems:
        rec.error_kind = ErrorKind.MISMATCH
        rec.error = "; ".join(problems)


def _check_inexact(rec: RequestRecord) -> None:
    """A stream whose tokens per chunk are unknown (neither token ids nor continuous usage,
    e.g. a generic OpenAI-compatible server with ``--no-vllm-extras``). Its times (TTFT, E2E,
    chunk gaps) are exact and its final usage, when sent, gives the output length; only
    the per-token figures are not. It keeps status ``ok`` with error_kind ``inexact`` (the
    analysis leaves it out of ITL, TPOT, TPS and tokens per chunk); the counts are still
    checked against the trace, from the usage, and any difference is added to ``error``."""
    why = "tokens per chunk not exact: the server sent neither token ids nor continuous usage"
    problems = []
    if rec.completion_tokens is None:
        problems.append("no usage: output length not checked")
    elif _output_differs(rec):
        problems.append(
            f"usage says {rec.completion_tokens} output tokens, trace has "
            f"{rec.expected_output_tokens}"
        )
    problems += _prompt_problem(rec)
    rec.error_kind = ErrorKind.INEXACT
    rec.error = "; ".join([why, *problems])


def inexact_counts_differ(rec: RequestRecord) -> bool:
    """An inexact stream's usage (when sent) disagrees with the trace's token counts: what
    ``_check_inexact`` writes into ``error``, as a count the run summary can keep."""
    return _output_differs(rec) or _prompt_differs(rec)


def usage_disagrees(rec: RequestRecord) -> bool:
    """The server's ``usage`` says another number of output tokens than its stream carried
    (exact streams only: an inexact one counts one token per event). Throughput counts the
    streamed tokens (``analysis.metrics.served_output_tokens``); the run counts these."""
    return (
        rec.completion_tokens is not None
        and rec.error_kind != ErrorKind.INEXACT
        and rec.completion_tokens != sum(rec.chunk_tokens)
    )


def _output_differs(rec: RequestRecord) -> bool:
    return rec.completion_tokens is not None and rec.completion_tokens != rec.expected_output_tokens


def _prompt_differs(rec: RequestRecord) -> bool:
    return rec.prompt_tokens is not None and rec.prompt_tokens != rec.expected_input_tokens


def _prompt_problem(rec: RequestRecord) -> list[str]:
    if _prompt_differs(rec):
        return [f"{rec.prompt_tokens} prompt tokens, trace has {rec.expected_input_tokens}"]
    return []
