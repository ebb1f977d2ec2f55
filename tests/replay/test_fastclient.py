"""The fast client (replay.fastclient): its response state machine fed read by read (every
split of a response), and over real loopback sockets: keep-alive reuse, Connection: close,
close-delimited and Content-Length bodies, errors (HTTP status with body, server closing
mid-stream, stall -> timeout, garbage, refused), cancellation, and the same records as the
aiohttp client on the fake vLLM and on the simulated engine's faults."""

from __future__ import annotations

import asyncio
import itertools
import socket
import types
from typing import Any

import pytest

from agent_replay.analysis.fixtures import rows_to_table
from agent_replay.analysis.metrics import request_metrics
from agent_replay.engines.sim.server import SimServer
from agent_replay.replay.client import EventStream, Prepared, Sender, make_session
from agent_replay.replay.fastclient import (
    ERROR_BODY,
    KEEPALIVE_S,
    ConnectionClosed,
    FastSender,
    H1Connection,
)
from agent_replay.replay.http1 import ProtocolError
from agent_replay.replay.outcome import RequestRecord
from tests.replay.fakeserver import FakeVllm, start
from tests.replay.rawserver import (
    LAST_CHUNK,
    SSE_HEAD,
    RawServer,
    Received,
    Step,
    chunk,
    chunked_response,
    events,
)
from tests.replay.test_client_errors import prep, rec

# -- the state machine, fed without sockets -----------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:  # pragma: no cover - not used here
        raise AssertionError("nothing is written in these tests")

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each read's monotonic_ns is the number of reads so far (1, 2, ...)."""
    reads = [0]

    def monotonic_ns() -> int:
        reads[0] += 1
        return reads[0]

    monkeypatch.setattr(
        "agent_replay.replay.fastclient.time", types.SimpleNamespace(monotonic_ns=monotonic_ns)
    )
    return reads


async def feed(
    reads: list[bytes], n_out: int = 5, api: str = "completions", lost: bool = False
) -> tuple[RequestRecord, asyncio.Future[int], H1Connection]:
    r = rec(40, n_out)
    r.api = api
    conn = H1Connection()
    tr = FakeTransport()
    conn.connection_made(tr)  # type: ignore[arg-type]
    stream = EventStream(r, api)
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    conn.begin(r, stream, fut)
    for data in reads:
        conn.data_received(data)
    if lost:
        conn.connection_lost(None)
    if fut.done() and fut.exception() is None:
        r.end_ns = fut.result()
        stream.finish(r.end_ns)
    return r, fut, conn


def split(raw: bytes, *cuts: int) -> list[bytes]:
    edges = [0, *cuts, len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(edges) if b > a]


EVS = events(5)
FULL = chunked_response(EVS)


def with_extensions(evs: list[bytes]) -> bytes:
    out = SSE_HEAD
    for e in evs:
        out += b"%x;ext=1\r\n%s\r\n" % (len(e), e)
    return out + b"0\r\nTrailer: x\r\n\r\n"


def crlf_events(evs: list[bytes]) -> list[bytes]:
    return [e.replace(b"\n", b"\r\n") for e in evs]


@pytest.mark.parametrize(
    "response",
    [
        FULL,
        with_extensions(EVS),
        chunked_response(crlf_events(EVS)),
        # several events per chunk, and events split over chunks
        chunked_response([b"".join(EVS[:3]), EVS[3][:10], EVS[3][10:] + b"".join(EVS[4:])]),
    ],
    ids=["plain", "extensions", "crlf", "regrouped"],
)
async def test_every_split_of_a_response(clock: list[int], response: bytes) -> None:
    for cut in range(1, len(response)):
        r, fut, conn = await feed(split(response, cut))
        assert fut.done() and fut.exception() is None, cut
        assert (r.status, r.error_kind, r.http_status) == ("ok", None, 200), (cut, r.error)
        assert list(r.chunk_tokens) == [1] * 5, cut
        assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (40, 5, 16)
        assert conn.keep_alive and not conn.transport.closed, cut  # type: ignore[union-attr]


@pytest.mark.parametrize("response", [FULL, with_extensions(EVS)], ids=["plain", "extensions"])
async def test_every_split_of_a_body_after_its_head(clock: list[int], response: bytes) -> None:
    # the head in a read of its own, so the body's reads start at a chunk boundary: whole
    # chunks at the start of a read take the short path, the rest the chunked decoder
    body = response[len(SSE_HEAD) :]
    for cut in range(len(body) + 1):
        clock[0] = 0
        reads = [SSE_HEAD, *split(body, cut)]
        r, fut, conn = await feed(reads)
        assert (r.status, r.error_kind) == ("ok", None), (cut, r.error)
        assert list(r.chunk_tokens) == [1] * 5, cut
        # every event is stamped with the read that completed it
        ends = (
            [body.index(chunk(e).split(b"\r\n", 1)[1][:-2]) + len(e) for e in EVS[:5]]
            if response is FULL
            else None
        )
        if ends is not None:
            assert list(r.chunk_ns) == [2 if e <= cut and cut else len(reads) for e in ends], cut
        assert conn.keep_alive and fut.result() == len(reads)


async def test_two_cuts_anywhere_in_a_short_response(clock: list[int]) -> None:
    raw = chunked_response(events(1))
    for a in range(1, len(raw)):
        for b in range(a + 1, len(raw)):
            r, _fut, _ = await feed(split(raw, a, b), n_out=1)
            assert r.status == "ok" and list(r.chunk_tokens) == [1], (a, b, r.error)


async def test_each_chunk_is_stamped_with_the_read_that_completed_it(clock: list[int]) -> None:
    # one byte per read: the read number is the clock
    r, fut, _ = await feed([FULL[i : i + 1] for i in range(len(FULL))])
    want = []
    pos = len(SSE_HEAD)
    for e in EVS[:5]:
        c = chunk(e)
        want.append(pos + c.index(b"\r\n") + 2 + len(e))  # 1-based read holding its last byte
        pos += len(c)
    assert list(r.chunk_ns) == want
    assert r.headers_ns == len(SSE_HEAD) and r.first_token_ns == want[0]
    assert fut.result() == len(FULL) == r.end_ns


async def test_one_read_per_chunk_takes_the_read_time(clock: list[int]) -> None:
    reads = [SSE_HEAD] + [chunk(e) for e in EVS] + [LAST_CHUNK]
    r, _fut, conn = await feed(reads)
    assert len(EVS) == 7  # 5 with a token each, the usage event, [DONE]
    assert list(r.chunk_ns) == [2, 3, 4, 5, 6] and r.headers_ns == 1 and r.end_ns == 9
    assert conn.keep_alive


async def test_content_length_body_every_split(clock: list[int]) -> None:
    body = b"".join(EVS)
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    for cut in range(1, len(raw)):
        r, _fut, conn = await feed(split(raw, cut))
        assert r.status == "ok" and list(r.chunk_tokens) == [1] * 5, (cut, r.error)
        assert conn.keep_alive


async def test_close_delimited_body_ends_at_close(clock: list[int]) -> None:
    raw = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(EVS)
    _r, fut, conn = await feed(split(raw, 60, 200))
    assert not fut.done()  # nothing says the body ended until the server closes
    conn.connection_lost(None)
    assert fut.result() == 3  # the last read, not the close
    r2, fut, conn = await feed(split(raw, 60, 200), lost=True)
    assert r2.status == "ok" and list(r2.chunk_tokens) == [1] * 5 and not conn.keep_alive


async def test_close_delimited_body_cut_by_a_reset_is_an_error(clock: list[int]) -> None:
    raw = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(EVS)
    _, fut, conn = await feed([raw])
    conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
    assert isinstance(fut.exception(), ConnectionClosed)
    assert "before the end of the response" in str(fut.exception())


async def test_bytes_after_the_response_close_the_connection(clock: list[int]) -> None:
    r, _, conn = await feed([FULL + b"HTTP/1.1 200 OK\r\n"])
    assert r.status == "ok" and not conn.keep_alive
    r, _fut, conn = await feed([FULL, b"unexpected"])
    assert r.status == "ok" and conn.transport.closed  # type: ignore[union-attr]


async def test_error_status_keeps_the_body_and_the_connection(clock: list[int]) -> None:
    raw = (
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(b"no such")
        + chunk(b" model")
        + LAST_CHUNK
    )
    for cut in range(1, len(raw)):
        _, fut, conn = await feed(split(raw, cut))
        assert fut.done() and conn.error_text() == "no such model" and conn.keep_alive, cut
    big = b"x" * (ERROR_BODY + 100)
    _, fut, conn = await feed(
        [b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(big), big[:3000], big[3000:]]
    )
    assert fut.done() and conn.error_text() == "x" * ERROR_BODY
    assert not conn.keep_alive  # the rest of the body was not read


@pytest.mark.parametrize(
    "reads,error",
    [
        ([b"HELLO\r\n\r\n"], "bad status line"),
        ([SSE_HEAD + b"zz\r\n"], "bad chunk-size line"),
        ([SSE_HEAD, b"5\r\ndata: x\n\nXX"], "chunk data not followed by CRLF"),
        ([SSE_HEAD, b"0x5\r\n"], "bad chunk-size line"),
    ],
)
async def test_garbage_fails_the_response_and_drops_the_connection(
    clock: list[int], reads: list[bytes], error: str
) -> None:
    _, fut, conn = await feed(reads)
    exc = fut.exception()
    assert isinstance(exc, ProtocolError) and error in str(exc)
    assert conn.transport.aborted and not conn.keep_alive  # type: ignore[union-attr]


async def test_event_that_is_not_json_fails_in_the_read(clock: list[int]) -> None:
    _, fut, conn = await feed([SSE_HEAD, chunk(b"data: {nope\n\n")])
    assert type(fut.exception()).__name__ == "JSONDecodeError"
    assert conn.transport.aborted  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "reads,message",
    [
        ([], "without a response"),
        ([b"HTTP/1.1 200"], "inside the response head (12 bytes)"),
        ([SSE_HEAD, chunk(EVS[0])], "before the end of the response"),
    ],
)
async def test_close_before_the_end(clock: list[int], reads: list[bytes], message: str) -> None:
    _, fut, _ = await feed(reads, lost=True)
    assert message in str(fut.exception())


# -- over sockets ---------------------------------------------------------------------


async def serve(servers: list[RawServer], script: Any) -> tuple[RawServer, str]:
    s = RawServer(script)
    servers.append(s)
    return s, await s.start()


def always(*steps: Step) -> Any:
    return lambda i, got: list(steps)


async def fast_send(
    url: str,
    p: Prepared,
    r: RequestRecord,
    timeout_s: float = 10.0,
    sender: FastSender | None = None,
) -> RequestRecord:
    s = sender or FastSender(url, timeout_s)
    try:
        await s.send(p, r)
    finally:
        if sender is None:
            await s.close()
    return r


async def test_request_bytes_on_the_wire_and_keep_alive_reuse(raw: list[RawServer]) -> None:
    srv, url = await serve(raw, always(FULL))
    sender = FastSender(url + "/base/", 10)
    rs = [await fast_send(url, prep(40, 5), rec(40, 5), sender=sender) for _ in range(3)]
    await sender.close()
    assert [(r.status, r.error_kind, list(r.chunk_tokens)) for r in rs] == [
        ("ok", None, [1] * 5)
    ] * 3
    assert srv.connections == 1 and sender.pool.opened == 1 and sender.chunks == 15
    assert [g.connection for g in srv.received] == [0, 0, 0]
    p = prep(40, 5)
    port = url.rsplit(":", 1)[1]
    assert srv.received[0].head == (
        b"POST /base/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nX-Session-ID: s\r\nX-Request-Id: rid-1\r\n"
        b"Content-Length: %d\r\n\r\n" % (port.encode(), len(p.body))
    )
    assert srv.received[0].body == p.body


async def test_concurrent_requests_open_one_connection_each_then_reuse(
    raw: list[RawServer],
) -> None:
    srv, url = await serve(raw, always(0.05, FULL))
    sender = FastSender(url, 10)
    for _ in range(2):
        rs = [rec(40, 5) for _ in range(6)]
        await asyncio.gather(*(sender.send(prep(40, 5), r) for r in rs))
        assert all(r.status == "ok" and r.error_kind is None for r in rs)
    await sender.close()
    assert srv.connections == 6 and sender.pool.opened == 6 and len(srv.received) == 12


async def test_writes_on_new_connections_pass_the_start_gate_again(raw: list[RawServer]) -> None:
    # Connections opened together complete in one loop iteration; their requests' writes go
    # through the gate a second time (a few per iteration), so a wave of new connections
    # does not hold every other stream's reads back. A kept-alive connection: one pass.
    srv, url = await serve(raw, always(0.05, FULL))
    sender = FastSender(url, 10)
    sender.gate.per_iteration = 2
    entered = 0
    enter = sender.gate.enter

    async def counting() -> None:
        nonlocal entered
        entered += 1
        await enter()

    sender.gate.enter = counting  # type: ignore[method-assign]
    for round_, want in ((1, 12), (2, 6)):
        entered = 0
        rs = [rec(40, 5) for _ in range(6)]
        await asyncio.gather(*(sender.send(prep(40, 5), r) for r in rs))
        assert all(r.status == "ok" for r in rs), round_
        assert entered == want, round_
        assert all((r.connect_ns is not None) == (round_ == 1) for r in rs)
    await sender.close()
    assert srv.connections == 6


async def test_connect_time_is_split_out_of_the_send(
    raw: list[RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that must open a connection records how long that took (connect_ns); its
    bytes go out after it, so TTFT counts from sent_ns + connect_ns and a slow connect is
    not server latency. A request on a kept-alive connection has connect_ns None."""
    srv, url = await serve(raw, always(FULL))
    sender = FastSender(url, 10)
    real_connect = sender.pool.connect

    async def slow_connect(timeout_s: float) -> H1Connection:
        await asyncio.sleep(0.05)
        return await real_connect(timeout_s)

    monkeypatch.setattr(sender.pool, "connect", slow_connect)
    first, second = rec(40, 5), rec(40, 5)
    await sender.send(prep(40, 5), first)
    await sender.send(prep(40, 5), second)
    await sender.close()
    assert (first.status, second.status) == ("ok", "ok") and sender.pool.opened == 1
    assert first.connect_ns is not None and 50_000_000 <= first.connect_ns < 1_000_000_000
    assert second.connect_ns is None
    assert first.sent_ns is not None and second.sent_ns is not None
    # the server read each request after it went out at sent_ns + connect_ns
    assert srv.received[0].at_ns >= first.sent_ns + first.connect_ns
    assert srv.received[1].at_ns >= second.sent_ns
    t0 = first.sent_ns  # both intended at t0
    m = request_metrics(
        rows_to_table(
            [
                {
                    "intended_ns": 0,
                    "sent_ns": r.sent_ns - t0,
                    "connect_ns": r.connect_ns,  # type: ignore[operator]
                    "first_token_ns": r.first_token_ns - t0,
                    "end_ns": r.end_ns - t0,
                }  # type: ignore[operator]
                for r in (first, second)
            ]
        )
    )
    assert m.ttft[0] == first.first_token_ns - first.sent_ns - first.connect_ns  # type: ignore[operator]
    assert m.ttft[0] < 50_000_000 <= m.ttft_intended[0]  # the connect counts from intended only
    assert m.schedule_lag[0] == 0 and m.connect[0] == first.connect_ns
    assert m.ttft[1] == second.first_token_ns - second.sent_ns  # type: ignore[operator]


async def test_aiohttp_client_records_connect_time_too(raw: list[RawServer]) -> None:
    srv, url = await serve(raw, always(FULL))
    session = make_session(10.0)
    sender = Sender(session, url)
    rs = [rec(40, 5) for _ in range(2)]
    for r in rs:
        await sender.send(prep(40, 5), r)
    await session.close()
    assert [r.status for r in rs] == ["ok", "ok"] and srv.connections == 1
    assert rs[0].connect_ns is not None and 0 < rs[0].connect_ns < 1_000_000_000
    assert rs[0].sent_ns is not None and srv.received[0].at_ns >= rs[0].sent_ns + rs[0].connect_ns
    assert rs[1].connect_ns is None


async def test_connection_close_is_honoured(raw: list[RawServer]) -> None:
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    srv, url = await serve(raw, always(chunked_response(EVS, head)))
    sender = FastSender(url, 10)
    rs = [await fast_send(url, prep(40, 5), rec(40, 5), sender=sender) for _ in range(2)]
    await sender.close()
    assert [r.status for r in rs] == ["ok", "ok"]
    assert srv.connections == 2 and [g.connection for g in srv.received] == [0, 1]


async def test_server_closing_an_idle_connection_is_not_an_error(raw: list[RawServer]) -> None:
    srv, url = await serve(raw, always(FULL, "close"))  # no Connection: close announced
    sender = FastSender(url, 10)
    r1 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    await asyncio.sleep(0.05)  # the close reaches us while the connection is idle
    r2 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    await sender.close()
    assert (r1.status, r2.status) == ("ok", "ok") and srv.connections == 2


async def test_idle_connections_expire(raw: list[RawServer]) -> None:
    srv, url = await serve(raw, always(FULL))
    sender = FastSender(url, 10)
    sender.pool.idle_ns = 0
    for _ in range(2):
        assert (await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)).status == "ok"
    await sender.close()
    assert srv.connections == 2


async def test_keep_alive_reuses_what_the_server_keeps_open(raw: list[RawServer]) -> None:
    """Idle 0.2 s: with a 0.1 s keep-alive the connection is closed and a new one opened
    (its connect time recorded); with AIPerf's 300 s it is reused (none recorded)."""
    got = {}
    for keep in (0.1, KEEPALIVE_S):
        srv, url = await serve(raw, always(FULL))
        sender = FastSender(url, 10, keepalive_s=keep)
        r1 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
        await asyncio.sleep(0.2)
        r2 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
        await sender.close()
        assert (r1.status, r2.status) == ("ok", "ok") and r1.connect_ns is not None
        got[keep] = (srv.connections, r2.connect_ns is not None)
    assert got == {0.1: (2, True), KEEPALIVE_S: (1, False)}


async def test_a_stale_reused_connection_is_sent_again_once(raw: list[RawServer]) -> None:
    """The server closes the kept connection without answering the second request (it
    closed it as the request went out): that request goes again on a new connection, once,
    with the time it lost inside its connect time. A new connection closed without an
    answer is an error, not sent again."""

    def script(i: int, got: Received) -> list[Step]:
        return ["close"] if i in (1, 3, 4) else [FULL]

    srv, url = await serve(raw, script)
    sender = FastSender(url, 10)
    r1 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    r2 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    assert (r1.status, r2.status, sender.resent) == ("ok", "ok", 1)
    assert [g.connection for g in srv.received] == [0, 0, 1]
    assert r2.connect_ns is not None and r2.sent_ns + r2.connect_ns > srv.received[1].at_ns
    r3 = await fast_send(
        url, prep(40, 5), rec(40, 5), sender=sender
    )  # reused, closed, then new and closed
    await sender.close()
    assert (r3.status, r3.error_kind, sender.resent) == ("error", "stream", 2)
    assert "without a response" in (r3.error or "") and srv.connections == 3


@pytest.mark.parametrize(
    "script,want",
    [
        (always(b"HTTP/1.0 200 OK\r\n\r\n" + b"".join(EVS), "close"), ("ok", None, 200, 5)),
        (
            always(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(b"".join(EVS))
                + b"".join(EVS)
            ),
            ("ok", None, 200, 5),
        ),
        (
            always(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 11\r\n\r\nslow down\r\n"),
            ("error", "http", 429, 0),
        ),
        (always(SSE_HEAD + chunk(EVS[0]) + chunk(EVS[1]), "close"), ("error", "stream", 200, 2)),
        (always(SSE_HEAD + chunk(EVS[0])[:20], "close"), ("error", "stream", 200, 0)),
        (always("close"), ("error", "stream", None, 0)),
        (always(b"HELLO WORLD\r\n\r\n", "close"), ("error", "stream", None, 0)),
        (always(SSE_HEAD + b"zz\r\n", "hold"), ("error", "stream", 200, 0)),
        (always(chunked_response([b"data: {nope\n\n"])), ("error", "json", 200, 0)),
        (always(SSE_HEAD + chunk(EVS[0]), "hold"), ("error", "timeout", 200, 1)),
        (always("hold"), ("error", "timeout", None, 0)),
        (always(chunked_response(EVS[:5])), ("error", "stream", 200, 5)),  # no [DONE]
    ],
    ids=[
        "http10-close",
        "content-length",
        "429",
        "close-mid-stream",
        "close-mid-chunk",
        "close-no-response",
        "garbage-head",
        "garbage-chunk",
        "json",
        "stall",
        "no-head",
        "no-end-marker",
    ],
)
async def test_outcomes_over_sockets(
    raw: list[RawServer], script: Any, want: tuple[str, str | None, int | None, int]
) -> None:
    _srv, url = await serve(raw, script)
    r = await fast_send(url, prep(40, 5), rec(40, 5), timeout_s=0.4)
    assert (r.status, r.error_kind, r.http_status, len(r.chunk_tokens)) == want, r.error
    assert r.sent_ns is not None and r.end_ns is not None and r.end_ns >= r.sent_ns
    if r.error_kind == "http":
        assert r.error == "HTTP 429: slow down"


async def test_failed_connection_is_not_reused(raw: list[RawServer]) -> None:
    def script(i: int, got: Received) -> list[Step]:
        return [SSE_HEAD + b"zz\r\n", "hold"] if i == 0 else [FULL]

    srv, url = await serve(raw, script)
    sender = FastSender(url, 10)
    r1 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    r2 = await fast_send(url, prep(40, 5), rec(40, 5), sender=sender)
    await sender.close()
    assert (r1.error_kind, r2.status, r2.error_kind) == ("stream", "ok", None)
    assert srv.connections == 2


async def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = await fast_send(f"http://127.0.0.1:{port}", prep(), rec())
    assert (r.status, r.error_kind) == ("error", "connect") and "cannot connect" in (r.error or "")


async def test_cancel_mid_stream_records_and_drops_the_connection(raw: list[RawServer]) -> None:
    steps: list[Step] = [SSE_HEAD]
    for e in EVS:
        steps += [chunk(e), 0.05]
    _srv, url = await serve(raw, always(*steps, LAST_CHUNK))
    sender = FastSender(url, 10)
    r = rec(40, 5)
    task = asyncio.ensure_future(sender.send(prep(40, 5), r))
    await asyncio.sleep(0.12)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (r.status, r.error_kind) == ("error", "cancelled") and 0 < len(r.chunk_tokens) < 5
    assert sender.pool.idle == 0 and sender.in_flight == 0
    await sender.close()


def test_https_is_not_for_the_fast_client() -> None:
    with pytest.raises(ValueError, match="plain http"):
        FastSender("https://example.com", 10)


# -- the same records as the aiohttp client -------------------------------------------


def sim_prep(n_in: int, n_out: int) -> Prepared:
    p = prep(n_in, n_out)
    p.body = p.body.replace(b'"fake-model"', b'"sim-fast"')
    return p


def outcome(r: RequestRecord) -> tuple[Any, ...]:
    return (
        r.status,
        r.error_kind,
        r.http_status,
        list(r.chunk_tokens),
        r.prompt_tokens,
        r.completion_tokens,
        r.cached_tokens,
    )


async def both(
    url: str, make_prep: Any, make_rec: Any, between: Any = None, fast_url: str | None = None
) -> tuple[RequestRecord, RequestRecord]:
    """The same request by the aiohttp client, then by the fast one (``between`` resets the
    server's prefix cache in between)."""
    a = make_rec()
    session = make_session(10.0)
    await Sender(session, url).send(make_prep(), a)
    await session.close()
    if between is not None:
        between()
    b = await fast_send(fast_url or url, make_prep(), make_rec())
    return a, b


@pytest.mark.parametrize(
    "case", ["multi", "split", "usage", "mismatch", "http", "truncate", "chat", "messages"]
)
async def test_same_records_as_aiohttp_on_the_fake_vllm(case: str) -> None:
    fake = FakeVllm()
    n_in, n_out, api, expect = 40, 9, "completions", (40, 9)
    if case == "multi":
        fake.tokens_per_chunk = 4
    elif case == "split":
        fake.split_writes, fake.tokens_per_chunk = True, 3
    elif case == "usage":
        fake.token_ids, fake.tokens_per_chunk = False, 3
    elif case == "mismatch":
        expect = (41, 10)
    elif case == "http":
        fake.fail_status = 500
    elif case == "truncate":
        fake.truncate = True
    else:
        api, n_in = case, 6

    def make_rec() -> RequestRecord:
        r = rec(*expect) if api == "completions" else rec(n_in, n_out)
        r.api = api
        return r

    runner, url = await start(fake)
    try:
        a, b = await both(url, lambda: prep(n_in, n_out, api), make_rec, fake.cache.clear)
    finally:
        await runner.cleanup()
    assert outcome(a) == outcome(b)
    assert a.error == b.error
    assert a.status == ("error" if case in ("http", "truncate") else "ok")
    if case == "truncate":
        assert (b.error_kind, a.error_kind) == ("stream", "stream")
    assert [s.body for s in fake.seen[:1]] == [s.body for s in fake.seen[1:]]
    assert fake.seen[0].headers["x-request-id"] == fake.seen[1].headers["x-request-id"] == "rid-1"


@pytest.mark.parametrize(
    "fault,kind",
    [
        ("", None),
        ("error=1", "http"),
        ("status=503;error=1", "http"),
        ("truncate_after=3", "stream"),
        ("malformed_after=2", "json"),
        ("reset_after=3", "stream"),
    ],
)
async def test_same_classification_as_aiohttp_on_the_simulated_engine(
    fault: str, kind: str | None
) -> None:
    def make_prep() -> Prepared:
        p = sim_prep(64, 12)
        if fault:
            p.headers = {**p.headers, "X-Sim-Fault": fault}
        return p

    async with SimServer("fast") as sim1, SimServer("fast") as sim2:  # each its own prefix cache
        a, b = await both(sim1.url, make_prep, lambda: rec(64, 12), fast_url=sim2.url)
    assert (a.error_kind, b.error_kind) == (kind, kind), (a.error, b.error)
    assert (a.status, a.http_status) == (b.status, b.http_status)
    if fault in ("", "truncate_after=3", "malformed_after=2"):
        assert outcome(a) == outcome(b)
    if not fault:
        assert list(b.chunk_tokens) == [1] * 12 and b.completion_tokens == 12


async def test_many_streams_on_the_simulated_engine() -> None:
    async with SimServer("fast") as sim:
        sender = FastSender(sim.url, 30)
        recs = [rec(64 + i, 20 + i % 7) for i in range(64)]
        await asyncio.gather(
            *(sender.send(sim_prep(64 + i, 20 + i % 7), r) for i, r in enumerate(recs))
        )
        await sender.close()
    assert all(r.status == "ok" and r.error_kind is None for r in recs), [
        r.error for r in recs if r.error
    ]
    assert [sum(r.chunk_tokens) for r in recs] == [20 + i % 7 for i in range(64)]
    assert sender.chunks == sum(20 + i % 7 for i in range(64))
    assert all(r.sent_ns < r.headers_ns <= r.first_token_ns <= r.end_ns for r in recs)  # type: ignore[operator]
    assert all(list(r.chunk_ns) == sorted(r.chunk_ns) for r in recs)


async def test_header_with_a_line_break_is_not_sent(raw: list[RawServer]) -> None:
    srv, url = await serve(raw, always(FULL))
    p = prep(40, 5)
    p.headers = {**p.headers, "X-Session-ID": "s\r\nX-Injected: 1"}
    r = await fast_send(url, p, rec(40, 5))
    assert (r.status, r.error_kind) == ("error", "stream") and "contains CR or LF" in (
        r.error or ""
    )
    assert srv.received == [] and srv.connections == 0
