"""The CLI under load: kill -9 leaves only readable part files and loses at most the last
flush interval; SIGTERM flushes everything and exits 0; no credential reaches any output."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.traces.io import read_trace, trace_files

KEY = "sk-live-SECRET-7c1e0b5d"
FLUSH_S = 0.3


async def _start(out: Path, upstream: str, *extra: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "record",
        "--upstream",
        upstream,
        "--listen",
        "127.0.0.1:0",
        "-o",
        str(out),
        "--flush-interval",
        str(FLUSH_S),
        *extra,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    assert "->" in line, line
    return proc, line.split()[2]


async def _load(url: str, stop: asyncio.Event, done: list[int], n: int = 16) -> None:
    body = {
        "model": "sim-fast",
        "stream": True,
        "max_tokens": 20,
        "api_key": KEY,
        "messages": [{"role": "user", "content": "load"}],
    }

    async def one(s: aiohttp.ClientSession, i: int) -> None:
        while not stop.is_set():
            try:
                async with s.post(
                    url + "/v1/chat/completions",
                    data=orjson.dumps(body),
                    headers={
                        "Authorization": f"Bearer {KEY}",
                        "Cookie": f"session={KEY}",
                        "X-Session-ID": f"s{i}",
                    },
                ) as r:
                    await r.read()
                    if r.status == 200:
                        done.append(time.monotonic_ns())
            except aiohttp.ClientError:
                await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s, i) for i in range(n)))


@pytest.mark.slow
async def test_kill_9_under_load(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    async with SimServer("fast") as sim:
        proc, url = await _start(out, sim.url, "--content", "full", "--quiet")
        stop, done = asyncio.Event(), []
        load = asyncio.create_task(_load(url, stop, done))
        deadline = time.monotonic() + 20
        while len([p for p in out.glob("part-*.parquet")]) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic_ns()
        await proc.wait()
        stop.set()
        await load
    files = trace_files(out)
    assert len(files) >= 4
    table, meta = read_trace(out)  # every file on disk is whole and readable
    assert meta.source == "recorded"
    rows = table.num_rows
    settled = sum(1 for t in done if t < killed - int(2 * FLUSH_S * 1e9))
    assert rows >= settled > 0
    assert rows <= len(done)
    _no_secret(out, table.to_pylist())


@pytest.mark.slow
async def test_sigterm_flushes_everything_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    async with SimServer("fast") as sim:
        proc, url = await _start(out, sim.url, "--content", "full")
        stop, done = asyncio.Event(), []
        load = asyncio.create_task(_load(url, stop, done, n=8))
        await asyncio.sleep(1.0)
        stop.set()
        await load
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        assert await proc.wait() == 0
    table, _ = read_trace(out)
    rows = table.to_pylist()
    assert len(rows) == len(done) > 0
    assert {r["session_id"] for r in rows} <= {f"s{i}" for i in range(8)}
    assert all(r["error"] is None for r in rows)
    assert "stopped; recorded" in err and KEY not in err
    _no_secret(out, rows)


def _no_secret(out: Path, rows: list[dict]) -> None:
    assert KEY not in repr(rows)
    for f in out.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    assert all(r["content"] is not None and "api_key" not in r["content"] for r in rows)


async def test_stop_during_a_periodic_flush_keeps_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() cancels the periodic flush; rows that flush had already taken must still be
    on disk when stop() returns."""
    import threading

    import aiohttp

    from agent_replay.replay.record import Recorder
    from agent_replay.replay.record.sink import PartWriter
    from agent_replay.traces.io import read_trace
    from tests.record.upstream import Upstream

    writing = threading.Event()
    original = PartWriter.write

    def slow_write(self: PartWriter, *args: Any, **kwargs: Any) -> Any:
        writing.set()
        time.sleep(0.4)  # a flush still in its thread when stop() comes
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PartWriter, "write", slow_write)
    async with Upstream() as up:
        rec = Recorder(up.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=0.05)
        await rec.start()
        async with (
            aiohttp.ClientSession() as s,
            s.post(rec.url + "/v1/completions", json={"model": "m", "prompt": "hi"}) as r,
        ):
            assert r.status == 200
            await r.read()
        while not writing.is_set():
            await asyncio.sleep(0.01)
        await rec.stop()
    table, _ = read_trace(tmp_path / "trace")
    assert table.num_rows == 1
