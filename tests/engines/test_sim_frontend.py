"""The front-end terms of a (fitted) profile on the real simulated server: a request reaches
the scheduler frontend_base_ns + frontend_per_prompt_token_ns * prompt after it arrives,
one request at a time."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from agent_replay.engines.sim import SimProfile, SimServer

MS = 1_000_000


async def _ttft_s(c: aiohttp.ClientSession, url: str, prompt: list[int]) -> float:
    body = {"prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True}
    t = time.monotonic()
    async with c.post(url + "/v1/completions", json=body) as r:
        async for _ in r.content.iter_any():
            return time.monotonic() - t
    raise AssertionError("no chunk")


async def test_front_end_delays_the_first_token_one_request_at_a_time() -> None:
    # 100 ms + 1 us per prompt token: a 100-token prompt waits 100.1 ms before its step
    prof = SimProfile.load("fast").replace(
        eos_prob=0.0, frontend_base_ns=100 * MS, frontend_per_prompt_token_ns=1000.0
    )
    async with SimServer(prof) as s, aiohttp.ClientSession() as c:
        alone = await _ttft_s(c, s.url, list(range(100, 200)))
        assert alone >= 0.100
        # two at once: the second passes the front end after the first, 200.2 ms in
        both = await asyncio.gather(
            _ttft_s(c, s.url, list(range(100, 200))), _ttft_s(c, s.url, list(range(300, 400)))
        )
        assert min(both) >= 0.100 and max(both) >= 0.200
