"""Hostile clients of the recorder: a request path whose dot segments (plain or
percent-encoded) climb above the upstream's base stays under it, one whose encoded
slashes hide them is refused; request lines aiohttp cannot parse are answered 400 and
counted, with no traceback logged."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agent_replay.replay.record import Recorder
from tests.replay.rawserver import RawServer

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _raw(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    got = await asyncio.wait_for(reader.read(4096), 10)
    writer.close()
    return got


async def test_paths_stay_under_the_upstream_base(tmp_path: Path) -> None:
    srv = RawServer(lambda i, got: [OK])
    up = await srv.start()
    rec = Recorder(up + "/base", "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60)
    await rec.start()
    try:
        answers = [
            await _raw(
                rec.url, f"GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
            )
            for p in (
                "/../../admin/secret",
                "/v1/%2e%2E/%2e%2e/%2E%2E/admin?a=../b",
                "/v1/./models",
                "/..%2f..%2fadmin",
                "/a/..%5c..%5cadmin",
            )
        ]
    finally:
        await rec.stop()
        await srv.stop()
    assert [a.split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 3 + [
        b"HTTP/1.1 400 Bad Request"
    ] * 2
    paths = [r.head.split(b" ")[1] for r in srv.received]
    assert paths == [b"/base/admin/secret", b"/base/admin?a=../b", b"/base/v1/models"]


async def test_malformed_request_lines_get_400_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = RawServer(lambda i, got: [OK])
    up = await srv.start()
    rec = Recorder(up, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60)
    await rec.start()
    bad = [
        b"GARBAGE\r\n\r\n",
        b"GET /\x00\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n",
    ]
    try:
        with caplog.at_level(logging.DEBUG):
            answers = [await _raw(rec.url, b) for b in bad]
            good = await _raw(
                rec.url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            line = rec.status_line()
    finally:
        await rec.stop()
        await srv.stop()
    assert [a.split(b" ")[1] for a in answers] == [b"400"] * 4
    assert good.startswith(b"HTTP/1.1 200")
    assert "4 malformed requests refused (400)" in line
    assert [r for r in caplog.records if r.name.startswith("aiohttp") and r.exc_info] == []
    assert len(srv.received) == 1
