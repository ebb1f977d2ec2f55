"""Ctrl-C (SIGINT) ends ``agent-replay engines sim`` quietly whenever it comes: while the
command is still starting (importing), idle, or with streams open; exit 0 once serving,
130 before, and at most one line on stderr."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
STREAM = {
    "model": "m",
    "prompt": "hello " * 20,
    "max_tokens": 4000,
    "stream": True,
    "ignore_eos": True,
}


async def _start() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "engines",
        "sim",
        "--port",
        "0",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def _interrupt(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.timing  # the first case needs the interpreter up within 0.3 s and imports after
async def test_sigint_while_starting_is_one_line() -> None:
    proc = await _start()
    await asyncio.sleep(0.3)  # the command is importing its modules (over 1 s here)
    rc, err = await _interrupt(proc)
    assert "Traceback" not in err and len(err.splitlines()) <= 1, err
    assert (rc, err) in ((130, "agent-replay: interrupted\n"), (0, "")), (rc, err)


@pytest.mark.parametrize("streams", [0, 30])
async def test_sigint_while_serving_is_silent(streams: int) -> None:
    proc = await _start()
    try:
        assert proc.stdout is not None
        url = (await proc.stdout.readline()).decode().split()[1]
        async with aiohttp.ClientSession() as s:
            resps = [await s.post(url + "/v1/completions", json=STREAM) for _ in range(streams)]
            for r in resps:
                await r.content.readany()  # every stream has started
            rc, err = await _interrupt(proc)
            ends = []
            for r in resps:  # each stream is cut or ended, none hangs
                try:
                    await asyncio.wait_for(r.read(), 10)
                    ends.append("ended")
                except aiohttp.ClientPayloadError:
                    ends.append("cut")
                r.release()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (rc, err) == (0, "")
    assert len(ends) == streams
