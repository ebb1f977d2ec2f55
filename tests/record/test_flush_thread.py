"""The periodic flush writes from a thread scheduled as SCHED_IDLE (Linux), so that a
part write never holds the CPU the event loop needs; the final flush writes the rest."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import aiohttp
import pytest

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from tests.record.upstream import Upstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
async def test_periodic_flush_in_an_idle_thread(upstream: Upstream, tmp_path: Path) -> None:
    async with Recorder(upstream.url, "127.0.0.1:0", tmp_path / "t",
                        flush_interval_s=0.05) as rec, aiohttp.ClientSession() as s:
        async with s.post(rec.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
            await r.read()
        for _ in range(200):
            if rec.stats.parts:
                break
            await asyncio.sleep(0.01)
        assert rec.stats.parts == 1  # written by the periodic flush
        flush = [t for t in threading.enumerate() if t.name.startswith("agent-replay-flush")]
        assert len(flush) == 1 and flush[0].native_id is not None
        assert os.sched_getscheduler(flush[0].native_id) == os.SCHED_IDLE
        async with s.post(rec.url + "/v1/chat/completions", json=CHAT) as r:
            await r.read()
    # the second request's row came with the stop's flush, or a periodic one before it
    assert [r["output_tokens"] for r in read_trace(rec.config.out_dir)[0].to_pylist()] == [5, 5]
