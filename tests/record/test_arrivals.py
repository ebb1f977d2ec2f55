"""A request's arrival is stamped when its headers are read off the connection, not when
its handler gets to run: a real aiohttp server (``StampingRunner``) on loopback, a raw
client socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiohttp import web

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.arrivals import StampingRunner, arrival_of
from agent_replay.traces.io import read_trace

HOLD_S = 0.2


async def _serve(clock: object) -> tuple[StampingRunner, int, list[tuple[int | None, int]]]:
    seen: list[tuple[int | None, int]] = []  # (stamp, the handler's own clock)

    async def handle(request: web.Request) -> web.Response:
        seen.append((arrival_of(request), time.monotonic_ns()))
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/x", handle)
    runner = StampingRunner(app, clock=clock)  # type: ignore[arg-type]
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port, seen


def _post(body: bytes) -> bytes:
    return (b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


async def _exchange(port: int, data: bytes, answers: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = b""
    while got.count(b"HTTP/1.1 200") < answers or not got.endswith(b"ok"):
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, got
        got += chunk
    writer.close()
    await writer.wait_closed()


async def test_the_stamp_is_taken_before_the_loop_gets_to_the_handler() -> None:
    loop = asyncio.get_running_loop()

    def clock() -> int:
        # the loop is then held up (another stream's work) before the handler runs
        loop.call_soon(time.sleep, HOLD_S)
        return time.monotonic_ns()

    runner, port, seen = await _serve(clock)
    try:
        await _exchange(port, _post(b"{}"), 1)
    finally:
        await runner.cleanup()
    ((stamp, handled),) = seen
    assert stamp is not None
    assert handled - stamp >= HOLD_S * 1e9  # the hold came after the stamp


async def test_pipelined_requests_arrive_together() -> None:
    # two requests in one write arrive at once; the second's handler runs only after the
    # first's answer, which the stamp does not wait for
    runner, port, seen = await _serve(time.monotonic_ns)
    try:
        await _exchange(port, _post(b"{}") + _post(b"[]"), 2)
    finally:
        await runner.cleanup()
    (s1, h1), (s2, h2) = seen
    assert s1 is not None and s1 == s2
    assert h2 > h1


async def test_the_recorder_stamps_a_pipelined_request_when_it_came(tmp_path: Path) -> None:
    body = (
        b'{"model": "sim-fast", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}'
    )
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    async with (
        SimServer("fast", seed=3) as sim,
        Recorder(sim.url, "127.0.0.1:0", tmp_path / "rec", flush_interval_s=60) as rec,
    ):
        port = int(rec.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(req + req)
        await writer.drain()
        got = b""
        while got.count(b'"finish_reason"') < 2:
            chunk = await asyncio.wait_for(reader.read(65536), 20)
            assert chunk, got
            got += chunk
        writer.close()
        await writer.wait_closed()
    rows = sorted(read_trace(tmp_path / "rec")[0].to_pylist(), key=lambda r: r["end_ns"])
    assert len(rows) == 2
    # both arrived in one write; the second was answered after the first
    assert rows[0]["arrival_ns"] == rows[1]["arrival_ns"] == 0
    assert rows[1]["end_ns"] > rows[0]["end_ns"] > 0
