"""The response body goes to the client below aiohttp's StreamResponse: HTTP/1.1 framing
(chunked or the upstream's length), keep-alive and a client slower than the upstream
still work, read here by h11 (a strict HTTP/1.1 parser) on a raw connection."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import h11
import orjson

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from tests.record.upstream import Upstream


class Conn:
    """One kept-alive client connection, requests one after another."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str, rcvbuf: int | None = None) -> Conn:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.connect((host, int(port)))
        return cls(*await asyncio.open_connection(sock=sock, limit=rcvbuf or 2**16))

    async def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        headers: list[tuple[str, str]] | None = None,
        pause_s: float = 0,
    ) -> tuple[h11.Response, bytes]:
        data = orjson.dumps(body) if body is not None else b""
        head = [("Host", "x"), ("Content-Length", str(len(data))), *(headers or [])]
        if self.h.our_state is h11.DONE:
            self.h.start_next_cycle()
        self.writer.write(
            self.h.send(h11.Request(method=method, target=path, headers=head))
            + self.h.send(h11.Data(data=data))
            + self.h.send(h11.EndOfMessage())
        )
        await self.writer.drain()
        resp: h11.Response | None = None
        body_out = bytearray()
        paused = False
        while True:
            ev = self.h.next_event()
            if ev is h11.NEED_DATA:
                if pause_s and resp is not None and not paused:
                    paused = True  # stop reading: the proxy's buffer to us fills up
                    await asyncio.sleep(pause_s)
                self.h.receive_data(await self.reader.read(4096))
            elif isinstance(ev, h11.Response):
                resp = ev
            elif isinstance(ev, h11.Data):
                body_out += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                assert resp is not None
                return resp, bytes(body_out)
            else:
                raise AssertionError(ev)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _framing(resp: h11.Response) -> tuple[str | None, str | None]:
    h = {k.decode().lower(): v.decode() for k, v in resp.headers}
    return h.get("transfer-encoding"), h.get("content-length")


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_framing_and_keep_alive(upstream: Upstream, recorder: Recorder) -> None:
    asks = [
        ("POST", "/v1/chat/completions", CHAT, [("X-Words", "40")]),
        ("POST", "/v1/completions", {"model": "m", "prompt": "hi"}, []),
        ("GET", "/v1/models", None, []),
        ("POST", "/v1/chat/completions", {**CHAT, "stream": False}, [("X-Fail", "gzip")]),
    ]
    got = {}
    for name, url in (("direct", upstream.url), ("proxy", recorder.url)):
        conn = await Conn.open(url)  # one connection for all four
        got[name] = [await conn.request(*a) for a in asks]
        await conn.close()
    for (d, dbody), (p, pbody) in zip(got["direct"], got["proxy"], strict=True):
        assert p.status_code == d.status_code == 200
        assert pbody == dbody  # the stream without the injected usage chunk, as direct
        assert _framing(p) == _framing(d)
    assert [_framing(p)[0] for p, _ in got["proxy"]] == ["chunked", None, None, None]
    await recorder.flush()
    rows = read_trace(recorder.config.out_dir)[0].to_pylist()
    assert [(r["error"], r["output_tokens"]) for r in rows] == [(None, 40), (None, 5), (None, 5)]


async def test_client_slower_than_upstream_gets_every_byte(
    upstream: Upstream, tmp_path: Path
) -> None:
    headers = [("X-Words", "20000")]  # ~2 MB of events, sent as fast as the upstream can
    direct = await Conn.open(upstream.url)
    _, want = await direct.request("POST", "/v1/chat/completions", CHAT, headers)
    await direct.close()
    async with Recorder(upstream.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60) as rec:
        conn = await Conn.open(rec.url, rcvbuf=4096)
        resp, body = await conn.request("POST", "/v1/chat/completions", CHAT, headers, pause_s=0.5)
        # the connection is still usable after a response that waited for the client
        again, small = await conn.request("POST", "/v1/completions", {"model": "m", "prompt": "hi"})
        await conn.close()
        await rec.flush()
        rows = read_trace(rec.config.out_dir)[0].to_pylist()
    assert resp.status_code == 200 and len(want) > 2_000_000 and body == want
    assert again.status_code == 200 and orjson.loads(small)["usage"]["completion_tokens"] == 5
    assert [(r["error"], r["output_tokens"]) for r in rows] == [(None, 20000), (None, 5)]


async def test_stream_reads_taken_in_data_received(upstream: Upstream, recorder: Recorder) -> None:
    """A stream's reads reach the client from the upstream connection's ``data_received``
    (``BodyTap``), not through ``readany``: with 2 ms between events, nearly every event
    is a read of its own. Fails if aiohttp stops feeding the body through the reader's
    ``feed_data``."""
    conn = await Conn.open(recorder.url)
    resp, body = await conn.request(
        "POST", "/v1/chat/completions", CHAT, [("X-Words", "40"), ("X-Delay-Ms", "2")]
    )
    await conn.close()
    assert resp.status_code == 200 and body.count(b"data: ") >= 41
    handler = recorder._handler
    assert handler is not None and handler.tapped_reads >= 20
