"""The reverse proxy: every request is forwarded to the upstream, and the upstream's answer
to the client, as it arrives. LLM API requests are also timed and observed.

Fidelity rules:

* Hop-by-hop header fields (RFC 9110 7.6.1, and those named in ``Connection``) are
  dropped both ways; everything else passes, ``Host`` becoming the upstream's.
* Bodies pass as bytes: no decompression (``Content-Encoding`` is the upstream's), the
  client gets chunked transfer when the upstream sent chunked, and the upstream's
  ``Content-Length`` otherwise.
* The one change to an exchange: see ``replay.record.wire`` (``include_usage``).
* Failures: an upstream that cannot be reached, or fails before its response started,
  gets the client a 502 whose JSON body, in the API's error shape, names the upstream and
  the cause (credentials redacted); one that stops answering gets a 504 before the
  response started. After it started, the client's connection is cut as the upstream's
  was. A client that goes away makes the proxy close the upstream connection (which is
  how servers such as vLLM learn to abort).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from agent_replay.engines.dialects import dialect
from agent_replay.redact import header_secrets, redact_url, scrub
from agent_replay.replay.client import fail_payload_on_close
from agent_replay.replay.record.arrivals import arrival_of
from agent_replay.replay.record.bigbody import BIG_BODY_BYTES, BigBodies, BodyDigest, pieces
from agent_replay.replay.record.bodytap import BodyTap
from agent_replay.replay.record.downstream import ClientBody, ClientGone
from agent_replay.replay.record.encodings import BodyRefused, DecodeLimits, Decoders, size_text
from agent_replay.replay.record.guard import upstream_path
from agent_replay.replay.record.observe import ResponseObserver
from agent_replay.replay.record.wire import (
    RequestInfo,
    agent_headers,
    api_for,
    end_to_end_headers,
    header_session,
    inspect_request,
    unrecorded_why,
)

_DROP_REQUEST = frozenset({"host", "content-length"})
_DROP_RESPONSE = frozenset({"content-length"})


@dataclass(slots=True, eq=False)
class Exchange:
    """One observed API request, its times (monotonic ns) and its outcome."""

    info: RequestInfo
    arrival: int
    send: int = 0
    headers: int | None = None
    end: int | None = None
    observer: ResponseObserver | None = None
    error: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    """Room for the recorder (session assignment...)."""


class ProxyHandler:
    """An aiohttp handler forwarding to ``upstream``.

    ``on_headers(ex)`` runs when the upstream answered (or failed before answering);
    ``on_done(ex)`` when the exchange is over, whatever happened; ``on_arrival(t)`` when an API
    request arrives, in arrival order (before its body is read; ``t``: when its headers
    were read off the connection, ``arrivals``). None may block.

    An API request body is read in the pieces it arrives in, at most ``max_body`` bytes
    (else 413); one over ``BIG_BODY_BYTES`` is parsed by ``big`` (off the event loop) and
    its exchange carries the ``BodyDigest`` as ``state["digest"]`` (``info.body`` is then
    empty). An encoded body (``Content-Encoding``) is decoded in a worker thread within
    ``limits`` (``replay.record.encodings``); one over them is refused with 413. A refused
    request is not forwarded; it still ends in ``on_done``, with its ``error`` and
    ``state["status"]`` 413. A body that is not a JSON object is forwarded and not
    recorded, counted by why in ``unrecorded``.
    """

    def __init__(
        self,
        upstream: str,
        session: aiohttp.ClientSession,
        *,
        on_headers: Callable[[Exchange], None],
        on_done: Callable[[Exchange], None],
        read_timeout_s: float | None,
        session_header: str = "X-Session-ID",
        clock: Callable[[], int] = time.monotonic_ns,
        on_arrival: Callable[[int], None] | None = None,
        authorization: str | None = None,
        max_body: int | None = None,
        big: BigBodies | None = None,
        limits: DecodeLimits = DecodeLimits(),
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.max_body = max_body
        self.big = big
        self.decoders = Decoders(limits)
        self.refused = 0
        """API requests answered 413 by the recorder itself (``max_body``, ``limits``)."""
        self.unrecorded: dict[str, int] = {}
        """API requests forwarded but not recorded, by why (``wire.UNRECORDED``)."""
        self.authorization = authorization
        """Sent upstream when the client sends no Authorization (the upstream URL's
        user-info, as Basic auth)."""
        self.session = session
        self.on_headers = on_headers
        self.on_done = on_done
        self.on_arrival = on_arrival
        self.read_timeout_s = read_timeout_s
        self.clock = clock
        self.session_header = session_header
        self.uncached_input = (
            "anthropic.com" in self.upstream.split("/")[2] if "//" in self.upstream else False
        )
        """Anthropic's own API counts only uncached prompt tokens in ``input_tokens``."""
        self.passed_through = 0
        self.tapped_reads = 0
        """Response body reads forwarded from the upstream connection's ``data_received``
        (``BodyTap``); the others went through ``readany``."""
        self.in_flight = 0
        self.last_arrival = 0
        """The latest API request's arrival (``clock``)."""
        self.draining = False
        """Set by the recorder's stop: new requests are refused (503), open ones end."""

    def _url(self, request: web.Request) -> str:
        return self.upstream + (upstream_path(request.raw_path) or "/")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        stamped = arrival_of(request)  # when its headers were read off the connection
        arrival = stamped if stamped is not None else self.clock()
        if self.draining:  # a kept-alive connection after the stop: not taken
            return web.Response(
                status=503,
                text="the recorder is stopping\n",
                headers={"Connection": "close", "Retry-After": "1"},
            )
        if upstream_path(request.raw_path) is None:
            return web.Response(
                status=400, text="the request path climbs out of the upstream's base\n"
            )
        self.in_flight += 1
        try:
            api = api_for(request.method, request.path)
            if api is None:
                return await self._pass_through(request)
            # API requests in arrival order: a pipelined one, read with the request before
            # it but handled after requests read later, takes the latest arrival taken
            arrival = self.last_arrival = max(arrival, self.last_arrival)
            if self.on_arrival is not None:  # before any await
                self.on_arrival(arrival)
            try:
                parts = await _read_parts(request, self.max_body)
                got = await self._parse(request, api, parts)
            except BodyRefused as exc:
                return self._refuse(request, api, arrival, str(exc))
            if isinstance(got, str):
                self.unrecorded[got] = self.unrecorded.get(got, 0) + 1
                return await self._pass_through(request, parts)
            info, send, digest = got
            ex = self._exchange_of(request, info, arrival)
            if digest is not None:
                ex.state["digest"] = digest
            try:
                return await self._exchange(request, ex, send)
            finally:
                if ex.end is None:
                    ex.end = self.clock()
                self.on_done(ex)
        finally:
            self.in_flight -= 1

    async def _parse(
        self, request: web.Request, api: str, parts: list[bytes]
    ) -> tuple[RequestInfo, list[bytes], BodyDigest | None] | str:
        """The request's info, the pieces to send upstream and a big body's digest; or why
        the body is not recorded (a key of ``wire.UNRECORDED``). An encoded body goes
        upstream as sent; it is decoded off the loop (``BodyRefused`` past a limit)."""
        encoding = request.headers.get("Content-Encoding")
        decoded = parts
        if encoding:
            pieces, why = await self.decoders.decode(parts, encoding)
            if pieces is None:
                return (
                    RequestInfo(
                        api=api,
                        body={},
                        model=None,
                        stream=False,
                        injected_usage=False,
                        session_hint=None,
                        undecoded=why,
                    ),
                    parts,
                    None,
                )
            decoded = pieces
        if self.big is not None and sum(map(len, decoded)) > BIG_BODY_BYTES:
            got = await self.big.digest(api, decoded, rewrite=not encoding)
            if isinstance(got, str):
                return got
            info, send, digest = got
            return info, (parts if encoding else send), digest
        raw = decoded[0] if len(decoded) == 1 else b"".join(decoded)
        inspected = inspect_request(api, raw, rewrite=not encoding, path=request.path)
        if inspected is None:
            return unrecorded_why(raw)
        info, body = inspected
        return info, (parts if encoding else [body]), None

    def _exchange_of(self, request: web.Request, info: RequestInfo, arrival: int) -> Exchange:
        ex = Exchange(info=info, arrival=arrival)
        sid = header_session(request.headers, self.session_header)
        if sid:
            ex.state["header_session"] = sid
        ex.state.update(agent_headers(request.headers))
        ex.state["headers"] = request.headers  # for the error text's scrub, if any
        return ex

    def _refuse(self, request: web.Request, api: str, arrival: int, why: str) -> web.StreamResponse:
        """Answer 413 in the API's error shape, without asking the upstream, and record
        the refusal (a row with its error; no content)."""
        self.refused += 1
        info = RequestInfo(
            api=api,
            body={},
            model=None,
            stream=False,
            injected_usage=False,
            session_hint=None,
            undecoded=why,
        )
        ex = self._exchange_of(request, info, arrival)
        ex.error = f"refused by the recorder (413): {why}"
        ex.state["status"] = 413
        ex.end = self.clock()
        self.on_done(ex)
        return web.Response(
            status=413,
            content_type="application/json",
            body=dialect(api).error_body(
                f"agent-replay record: {why}", 413, "invalid_request_error"
            ),
        )

    async def _pass_through(
        self, request: web.Request, parts: list[bytes] | None = None
    ) -> web.StreamResponse:
        self.passed_through += 1
        headers = self._headers(request)
        data: Any
        if parts is not None:
            data = _body_data(parts, headers)
        else:
            data = _body_iter(request) if request.body_exists else None
        out: ClientBody | None = None
        try:
            async with self.session.request(
                request.method,
                self._url(request),
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=self._timeout(),
            ) as resp:
                out = await self._prepare(request, resp, resp.headers.get("Content-Length"))
                read = resp.content.readany
                while chunk := await read():
                    if out.write(chunk):
                        await out.drain()
                await out.end()
                return out.response
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._fail(request, exc, out)

    def _timeout(self) -> aiohttp.ClientTimeout:
        """The read timeout; the connect timeouts are the session's (a request's own
        ``ClientTimeout`` replaces the session's whole)."""
        base = self.session.timeout
        return aiohttp.ClientTimeout(
            total=None,
            connect=base.connect,
            sock_connect=base.sock_connect,
            sock_read=self.read_timeout_s,
        )

    async def _prepare(
        self, request: web.Request, resp: aiohttp.ClientResponse, length: str | None
    ) -> ClientBody:
        headers = CIMultiDict(end_to_end_headers(resp.headers, _DROP_RESPONSE))
        out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=headers)
        if length is not None:
            out.content_length = int(length)
        await out.prepare(request)
        return ClientBody(request, out)

    def _fail(
        self,
        request: web.Request,
        exc: BaseException,
        out: ClientBody | None,
        api: str | None = None,
    ) -> web.StreamResponse:
        """Show an upstream failure to the client: before the response started, 504 for a
        timeout and 502 for anything else; after, a cut connection."""
        if (
            out is None
            and isinstance(exc, asyncio.TimeoutError)
            and not isinstance(exc, aiohttp.ConnectionTimeoutError)
        ):
            return web.Response(status=504, text="upstream timed out\n")
        if out is None:
            message = scrub(
                upstream_failure(redact_url(self.upstream), exc),
                header_secrets(request.headers.items()),
            )
            return web.Response(
                status=502,
                content_type="application/json",
                body=dialect(api or "chat").error_body(message, 502, "upstream_error"),
            )
        transport = request.transport
        if transport is not None:
            transport.abort()
        raise ClientGone from exc

    def _headers(self, request: web.Request) -> list[tuple[str, str]]:
        headers = end_to_end_headers(request.headers, _DROP_REQUEST)
        if self.authorization is not None and "Authorization" not in request.headers:
            headers.append(("Authorization", self.authorization))
        return headers

    async def _exchange(
        self, request: web.Request, ex: Exchange, body: list[bytes]
    ) -> web.StreamResponse:
        headers = self._headers(request)
        obs = ResponseObserver(
            ex.info.api, injected_usage=ex.info.injected_usage, uncached_input=self.uncached_input
        )
        ex.observer = obs
        later = ObserveLater(obs)
        out: ClientBody | None = None
        clock = self.clock
        try:
            ex.send = clock()
            data = _body_data(body, headers)
            async with self.session.request(  # a big body goes in pieces, between other work
                request.method,
                self._url(request),
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=self._timeout(),
            ) as resp:
                ex.headers = clock()
                length = resp.headers.get("Content-Length")
                obs.start(
                    resp.status,
                    resp.headers.get("Content-Type", ""),
                    resp.headers.get("Content-Encoding", ""),
                    int(length) if length is not None else None,
                )
                if obs.filtering:
                    length = None
                self.on_headers(ex)
                unwatch = fail_payload_on_close(resp)
                deadline = ReadDeadline.start(resp, self.read_timeout_s, clock)
                tap: BodyTap | None = None
                try:
                    out = await self._prepare(request, resp, length)
                    write, forward, add = out.write, obs.forward, later.add

                    def take(chunk: bytes) -> bool:
                        # Forwarded now, observed later: the parse waits until the loop
                        # has forwarded what else came in the same wake-up.
                        t = clock()
                        ex.end = t
                        if deadline is not None:
                            deadline.last = t
                        paused = write(forward(chunk))
                        add(chunk, t)
                        return paused

                    tap = BodyTap.attach(resp.content, take)
                    read = resp.content.readany
                    paused = False
                    while True:
                        while paused or (tap is not None and tap.slow):
                            if paused:
                                await _wait_client(out, deadline, clock)
                            paused = tap.resume() if tap is not None else False
                        chunk = await read()
                        if not chunk:
                            ex.state["upstream_done"] = True
                            break
                        paused = take(chunk)
                finally:
                    unwatch()
                    if deadline is not None:
                        deadline.cancel()
                    if tap is not None:
                        tap.detach()
                        self.tapped_reads += tap.direct
                later.drain()
                if out.write(obs.end(ex.end or clock())):
                    await out.drain()
                if ex.end is None:
                    ex.end = clock()
                if resp.status >= 400:
                    detail = obs.server_error()
                    ex.error = f"http {resp.status}" + (f": {detail}" if detail else "")
                elif obs.server_error():
                    ex.error = f"server error in stream: {obs.server_error()}"
                elif obs.stream_error:
                    ex.error = obs.stream_error
                await out.end()
                return out.response
        except (asyncio.CancelledError, ClientGone):
            later.drain()
            if not answered(ex):
                ex.error = ex.error or (
                    "cut by the recorder's stop" if self.draining else "client disconnected"
                )
            raise
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
            later.drain()
            ex.error = _cause(exc)
            return self._fail(request, exc, out, ex.info.api)
        finally:
            later.drain()


async def _wait_client(
    out: ClientBody, deadline: ReadDeadline | None, clock: Callable[[], int]
) -> None:
    """Wait until the client takes what was written (time that is not the upstream's)."""
    if deadline is None:
        await out.drain()
        return
    deadline.paused = True
    try:
        await out.drain()
    finally:
        deadline.paused = False
        deadline.last = clock()


class ReadDeadline:
    """The read timeout of a response body (``read_timeout_s`` without a byte from the
    upstream ends the body with aiohttp's ``SocketTimeoutError``), kept by one timer that
    is re-armed only when it fires: aiohttp's own (``sock_read``) cancels and re-arms a
    timer at every read. The reader stores each read's time in ``last``; time spent
    waiting on a slow client (``paused``) is not the upstream's."""

    __slots__ = ("_clock", "_content", "_handle", "_loop", "_ns", "last", "paused")

    def __init__(
        self, resp: aiohttp.ClientResponse, timeout_s: float, clock: Callable[[], int]
    ) -> None:
        self._content = resp.content
        self._ns = int(timeout_s * 1e9)
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self.last = clock()
        self.paused = False
        self._handle = self._loop.call_later(timeout_s, self._check)

    @classmethod
    def start(
        cls, resp: aiohttp.ClientResponse, timeout_s: float | None, clock: Callable[[], int]
    ) -> ReadDeadline | None:
        """Take the body's read timeout over from aiohttp (None: there is none, or the
        response has no connection of its own any more)."""
        conn = resp.connection
        proto = conn.protocol if conn is not None else None
        if not timeout_s or proto is None:
            return None
        proto.read_timeout = None  # for this response: set again for the next one
        return cls(resp, timeout_s, clock)

    def _check(self) -> None:
        idle = self._clock() - self.last
        if self.paused or idle < self._ns:
            wait = self._ns if self.paused else self._ns - idle
            self._handle = self._loop.call_later(wait / 1e9, self._check)
            return
        self._content.set_exception(
            aiohttp.SocketTimeoutError("Timeout on reading data from socket")
        )

    def cancel(self) -> None:
        self._handle.cancel()


class ObserveLater:
    """The observer's share of each read, run after the forwarding: ``add`` keeps the read
    and its time and asks the loop for one call soon, which observes everything kept, in
    order. So when many upstreams' chunks arrive in one wake-up of the loop, every one is
    forwarded before any is parsed. ``drain`` observes what is still kept, at once (before
    the observer's results are read)."""

    __slots__ = ("_kept", "_loop", "_obs")

    def __init__(self, obs: ResponseObserver) -> None:
        self._obs = obs
        self._kept: list[tuple[bytes, int]] = []
        self._loop = asyncio.get_running_loop()

    def add(self, chunk: bytes, t: int) -> None:
        if not self._kept:
            self._loop.call_soon(self.drain)
        self._kept.append((chunk, t))

    def drain(self) -> None:
        kept, self._kept = self._kept, []
        observe = self._obs.observe
        for chunk, t in kept:
            observe(chunk, t)


async def _read_parts(request: web.Request, limit: int | None) -> list[bytes]:
    """The request body in the pieces it arrived in (no copy into one buffer, which for a
    big body holds the GIL for tens of milliseconds); over ``limit`` bytes: 413."""
    parts: list[bytes] = []
    size = 0
    read = request.content.readany
    while True:
        chunk = await read()
        if not chunk:
            return parts
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyRefused(f"the body is larger than {size_text(limit)} (--max-body)")
        parts.append(chunk)


def _body_data(parts: list[bytes], headers: list[tuple[str, str]]) -> Any:
    """What aiohttp sends as the body ``parts``: one piece as bytes; several one at a
    time, with their length in ``headers`` (so not as chunked transfer)."""
    if len(parts) <= 1:
        return parts[0] if parts else b""
    headers.append(("Content-Length", str(sum(map(len, parts)))))
    return pieces(parts)


def answered(ex: Exchange) -> bool:
    """The client had the whole answer when its connection went: the upstream's body
    ended, or the stream's end event (``[DONE]``, ``message_stop``,
    ``response.completed``) was forwarded. A client that closes then (the OpenAI SDK stops
    reading at ``[DONE]``) did not disconnect early."""
    if ex.state.get("upstream_done"):
        return True
    obs = ex.observer
    return obs is not None and obs.finished()


def upstream_failure(upstream: str, exc: BaseException) -> str:
    """The line a client gets in the 502 for an upstream that failed before answering."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"agent-replay record: upstream {upstream} unreachable: connect timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        why = (
            os.strerror(err.errno)
            if err.errno and not isinstance(err, socket.gaierror)
            else err.strerror or str(err)
        )
        return f"agent-replay record: upstream {upstream} unreachable: {why.lower()}"
    return f"agent-replay record: upstream {upstream} failed before answering: " + _cause(
        exc
    ).removeprefix("upstream ")


def _cause(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "upstream connect timeout"
    if isinstance(exc, asyncio.TimeoutError):
        return "upstream timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"upstream connect failed: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ClientPayloadError) and str(exc).startswith("upstream"):
        return str(exc)[:200]
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return f"upstream connection reset: {type(exc).__name__}"
    if isinstance(exc, (ConnectionResetError, aiohttp.ClientOSError)):
        return f"upstream connection reset: {exc}"[:200]
    return f"upstream error: {type(exc).__name__}: {exc}"[:200]


async def _body_iter(request: web.Request) -> AsyncIterator[bytes]:
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return
        yield chunk


@web.middleware
async def client_gone_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn ``ClientGone`` into a quiet end of the connection."""
    try:
        return await handler(request)
    except ClientGone:
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError from None
