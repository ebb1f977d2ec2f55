"""A full disk loses no recorded row: a failed flush keeps its rows and retries, the
recorder keeps proxying and says so, and the rows land once space returns. A final flush
that still cannot write ends with the count of unwritten rows and exit 1."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.sink import PartWriter
from agent_replay.traces.io import read_trace

FLUSH_S = 0.2
BODY = {
    "model": "sim-fast",
    "stream": True,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "disk full"}],
}


async def _one(s: aiohttp.ClientSession, url: str) -> bool:
    async with s.post(url + "/v1/chat/completions", data=orjson.dumps(BODY)) as r:
        await r.read()
        return r.status == 200


async def test_failed_flush_keeps_rows_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC injected into the part writer: the rows wait in memory, the status line
    warns, and the next successful flush writes every one of them."""
    real = PartWriter.write
    full = {"on": True}

    def write(self: PartWriter, rows: list[dict[str, Any]], meta: Any) -> Path:
        if full["on"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, rows, meta)

    monkeypatch.setattr(PartWriter, "write", write)
    async with SimServer("fast") as sim:
        rec = Recorder(sim.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60)
        await rec.start()
        try:
            async with aiohttp.ClientSession() as s:
                assert all([await _one(s, rec.url) for _ in range(5)])
                with pytest.raises(Exception, match="5 rows not written"):
                    await rec.flush()
                assert rec.stats.unwritten == 5
                assert "WARNING: 5 rows NOT written (No space left on device" in rec.status_line()
                assert all([await _one(s, rec.url) for _ in range(3)])  # still proxying
                with pytest.raises(Exception, match="8 rows not written"):
                    await rec.flush()
                full["on"] = False
                assert all([await _one(s, rec.url) for _ in range(2)])
                path = await rec.flush()
        finally:
            await rec.stop()
    assert path is not None and path.name == "part-00001.parquet"
    assert rec.stats.unwritten == 0 and "WARNING" not in rec.status_line()
    table, _ = read_trace(tmp_path / "trace")
    assert table.num_rows == 10


async def test_final_flush_failure_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def write(self: PartWriter, rows: list[dict[str, Any]], meta: Any) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(PartWriter, "write", write)
    async with SimServer("fast") as sim:
        rec = Recorder(
            sim.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60, write_retry_s=0.3
        )
        await rec.start()
        async with aiohttp.ClientSession() as s:
            assert all([await _one(s, rec.url) for _ in range(4)])
        t0 = time.monotonic()
        await rec.stop()  # no exception, no traceback: the count says what was lost
        assert time.monotonic() - t0 < 5
    assert rec.stats.unwritten == 4
    assert rec.stats.write_error is not None and "No space" in rec.stats.write_error


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    return r.returncode == 0


async def _load(url: str, stop: asyncio.Event, done: list[int], n: int = 8) -> None:
    async def one(s: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                if await _one(s, url):
                    done.append(1)
            except aiohttp.ClientError:
                await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(n)))


@pytest.mark.slow
async def test_tmpfs_full_then_space_returns(tmp_path: Path) -> None:
    """A real 2 MB tmpfs: fill it, record under load, free the space: every request a
    client completed is in the trace; the status said the disk was full meanwhile."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        out = disk / "trace"
        async with SimServer("fast") as sim:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_replay",
                "record",
                "--upstream",
                sim.url,
                "--listen",
                "127.0.0.1:0",
                "-o",
                str(out),
                "--flush-interval",
                str(FLUSH_S),
                stderr=asyncio.subprocess.PIPE,
            )
            assert proc.stderr is not None
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            url = line.split()[2]
            filler = disk / "filler"
            with open(filler, "wb") as f:  # leave no room for a part file
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
            stop, done = asyncio.Event(), []
            load = asyncio.create_task(_load(url, stop, done))
            warned = ""
            deadline = time.monotonic() + 20
            while "cannot write" not in warned and time.monotonic() < deadline:
                warned += (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            assert "No space left on device" in warned
            await asyncio.sleep(4 * FLUSH_S)
            during = len(done)
            filler.unlink()
            await asyncio.sleep(4 * FLUSH_S)
            stop.set()
            await load
            proc.send_signal(signal.SIGTERM)
            rest = (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
            assert await proc.wait() == 0, rest
        table, _ = read_trace(out)
        print(
            f"disk full: {len(done)} requests completed ({during} while full), "
            f"{table.num_rows} rows written"
        )
        assert during > 0 and len(done) > during
        assert "writing again" in rest
        assert table.num_rows >= len(done)  # every completed request, none lost
        assert f"recorded {table.num_rows} requests" in rest
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
async def test_tmpfs_full_at_exit_is_loud(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        out = disk / "trace"
        async with SimServer("fast") as sim:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_replay",
                "record",
                "--upstream",
                sim.url,
                "--listen",
                "127.0.0.1:0",
                "-o",
                str(out),
                "--flush-interval",
                "60",
                "--write-retry",
                "1.5",
                stderr=asyncio.subprocess.PIPE,
            )
            assert proc.stderr is not None
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            url = line.split()[2]
            with open(disk / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass
            async with aiohttp.ClientSession() as s:
                assert all([await _one(s, url) for _ in range(6)])
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
            rc = await proc.wait()
            took = time.monotonic() - stopped
        assert rc == 1, rest
        assert took >= 1.5  # the final write was retried for --write-retry
        assert "6 recorded rows could not be written (No space left on device" in rest
        assert "Traceback" not in rest
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_negative_write_retry_is_refused(tmp_path: Path) -> None:
    from agent_replay.errors import InputError
    from agent_replay.replay.record import Recorder

    with pytest.raises(InputError, match="--write-retry must be >= 0"):
        Recorder("http://127.0.0.1:9", "127.0.0.1:0", tmp_path / "t", write_retry_s=-1)
