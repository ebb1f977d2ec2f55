from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from agent_replay.analysis.server_metrics import summarize
from agent_replay.engines.metrics_scrape import Scraper, parse_metrics
from agent_replay.errors import ProtocolError
from agent_replay.results_schema import SERVER_METRICS_SCHEMA

FIXTURE = (
    Path(__file__).parent.parent / "analysis" / "fixtures" / "vllm_cpu_metrics_llama_ngram.txt"
)


def test_parse_keeps_vllm_samples_and_drops_created() -> None:
    text = '# TYPE python_info gauge\npython_info{x="1"} 1\n' + FIXTURE.read_text()
    rows = parse_metrics(text, 7)
    assert rows and all(r[1].startswith("vllm:") and r[0] == 7 for r in rows)
    assert not any(r[1].endswith("_created") for r in rows)
    by = {(r[1], r[2]): r[3] for r in rows}
    assert by[("vllm:prefix_cache_hits_total", '{"engine":"0","model_name":"tiny-llama"}')] == 768
    key = (
        "vllm:time_to_first_token_seconds_bucket",
        '{"engine":"0","le":"+Inf","model_name":"tiny-llama"}',
    )
    assert by[key] == 6
    everything = parse_metrics(text, 0, prefixes=None)
    assert (0, "python_info", '{"x":"1"}', 1.0) in everything
    assert len([r for r in everything if r[1].startswith("vllm:")]) == len(rows)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ProtocolError, match="not Prometheus text"):
        parse_metrics("vllm:x{ 1 2 3\n", 0)


class _FakeServer:
    """A /metrics endpoint whose counter grows by 10 per scrape; fails on request 3."""

    def __init__(self) -> None:
        self.hits = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.hits == 3:
            return web.Response(status=500, text="boom")
        body = (
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {10 * self.hits}\n'
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.hits}\n'
        )
        return web.Response(text=body, content_type="text/plain")


async def _serve(handler: object) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def test_scraper_samples_until_stop_and_survives_errors() -> None:
    fake = _FakeServer()
    runner, url = await _serve(fake.handle)
    ticks = iter(range(0, 10**12, 1000))
    try:
        scraper = Scraper(url, interval_s=0.02, clock_ns=lambda: next(ticks))
        await scraper.start()
        while fake.hits < 6:
            await asyncio.sleep(0.01)
        table = await scraper.stop()
    finally:
        await runner.cleanup()
    assert table.schema.equals(SERVER_METRICS_SCHEMA)
    assert scraper.errors == 1 and "500" in (scraper.last_error or "")
    assert scraper.scrapes == fake.hits - 1
    times = table.column("t_ns").to_pylist()
    assert times == sorted(times)
    gen = [
        v
        for n, v in zip(
            table.column("name").to_pylist(), table.column("value").to_pylist(), strict=True
        )
        if n == "vllm:generation_tokens_total"
    ]
    assert gen[0] == 10 and gen[-1] == 10 * fake.hits and 30 not in gen
    assert json.loads(table.column("labels")[0].as_py()) == {"engine": "0", "model_name": "m"}
    s = summarize(table)
    assert s["generation_tokens"] == 10 * fake.hits - 10


async def test_scraper_on_unreachable_server_counts_errors() -> None:
    runner, url = await _serve(_FakeServer().handle)
    await runner.cleanup()  # nothing listens there now
    scraper = Scraper(url, interval_s=10, timeout_s=2)
    await scraper.start()
    table = await scraper.stop()
    assert table.num_rows == 0 and scraper.errors == 2 and scraper.scrapes == 0


async def test_scraper_against_the_simulated_engine() -> None:
    sim = pytest.importorskip("agent_replay.engines.sim.server")
    server = sim.SimServer("fast")
    await server.start()
    try:
        scraper = Scraper(server.url, interval_s=0.05)
        await scraper.start()
        import aiohttp

        async with aiohttp.ClientSession() as http:
            body = {
                "model": server.profile.model_name,
                "prompt": list(range(1000, 1064)),
                "max_tokens": 8,
                "ignore_eos": True,
            }
            for _ in range(2):
                async with http.post(server.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
        table = await scraper.stop()
    finally:
        await server.stop()
    s = summarize(table)
    assert s["generation_tokens"] == 16
    assert s["prompt_tokens"] is not None and s["prompt_tokens"] <= 128
    assert s["prefix_cache"]["queries"] == 128
    assert s["histograms"]["ttft"]["count"] == 2
