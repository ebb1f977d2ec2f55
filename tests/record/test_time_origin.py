"""Time zero of a recorded trace is the first request to arrive, even when a later request
is answered first (answers come back out of order)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from agent_replay.traces.validate import validate_or_raise


async def _slow_then_fast_upstream() -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(0.3 if body["prompt"] == "first" else 0.0)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def test_first_arrival_is_time_zero(tmp_path: Path) -> None:
    runner, url = await _slow_then_fast_upstream()
    try:
        async with (
            Recorder(url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60) as rec,
            aiohttp.ClientSession() as s,
        ):

            async def post(prompt: str) -> None:
                async with s.post(
                    rec.url + "/v1/completions",
                    data=orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}),
                    headers={"Content-Type": "application/json"},
                ) as r:
                    assert r.status == 200
                    await r.read()

            first = asyncio.create_task(post("first"))  # answered 0.3 s later
            await asyncio.sleep(0.05)
            await post("second")  # arrives later, answered at once
            await first
    finally:
        await runner.cleanup()
    table, meta = read_trace(tmp_path / "trace")
    validate_or_raise(table, meta, str(tmp_path / "trace"))
    arrivals = sorted(table.column("arrival_ns").to_pylist())
    assert arrivals[0] == 0
    assert 40_000_000 <= arrivals[1] <= 250_000_000
