"""Compressed request bodies for the recorder's probes: bombs (a few KB that decode to
gigabytes) and an ordinary big body, and a harness that runs the recorder as a process in
front of ``tests.faults.streamserver`` with live streams beside what is posted.

Used by ``tests/faults/test_bombs.py`` and ``benchmarks/bench_bombs.py``."""

from __future__ import annotations

import asyncio
import gzip
import random
import sys
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _zeros(total: int, piece: int = 4 * MIB) -> list[bytes]:
    return [b"\0" * min(piece, total - i) for i in range(0, total, piece)]


def gzip_bomb(decoded: int) -> bytes:
    """``decoded`` zero bytes, gzip (about 1,000 to 1)."""
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join([*(c.compress(p) for p in _zeros(decoded)), c.flush()])


def brotli_bomb(decoded: int) -> bytes:
    """``decoded`` zero bytes, brotli (about 600,000 to 1 for 1 GiB)."""
    import brotli  # type: ignore[import-not-found,unused-ignore]

    c = brotli.Compressor(quality=3)
    return b"".join([*(c.process(p) for p in _zeros(decoded)), c.finish()])


def zstd_bomb(decoded: int) -> bytes:
    """``decoded`` zero bytes, zstd (about 30,000 to 1)."""
    import zstandard  # type: ignore[import-not-found,unused-ignore]

    c = zstandard.ZstdCompressor(level=3).compressobj()
    return b"".join([*(c.compress(p) for p in _zeros(decoded)), c.flush()])


BOMBS: dict[str, Callable[[int], bytes]] = {"br": brotli_bomb, "zstd": zstd_bomb, "gzip": gzip_bomb}


def ordinary_body(size: int, seed: int = 1) -> bytes:
    """A chat request of about ``size`` bytes of word salad (gzip: about 3 to 1)."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ]
    per = 200_000
    msgs = []
    while sum(len(m["content"]) for m in msgs) < size:
        msgs.append({"role": "user", "content": " ".join(rng.choices(words, k=per // 6))})
    return orjson.dumps({"model": "m", "stream": True, "max_tokens": 3, "messages": msgs})


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6, mtime=0)


async def slices(data: bytes, size: int = 1 << 18) -> AsyncIterator[bytes]:
    """``data`` posted a slice at a time (a bytes body is copied whole on the client's
    loop, which would stall the streams it measures)."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def rss_peak(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def rss_now(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def reset_peak(pid: int) -> None:
    """Start ``VmHWM`` again from the current resident set (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclass
class Posted:
    """What one posted body got: its status, the first bytes of its answer, its time."""

    name: str
    status: int
    body: bytes
    seconds: float


@dataclass
class Phase:
    name: str
    gaps: list[float] = field(default_factory=list)
    posted: list[Posted] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0


STREAM_BODY = orjson.dumps(
    {
        "model": "m",
        "stream": True,
        "max_tokens": 100,
        "temperature": 5,  # streamserver: 5 ms between chunks
        "messages": [{"role": "user", "content": "small"}],
    }
)


class Rig:
    """The stream server and the recorder (``agent-replay record``), as processes."""

    def __init__(self, out: Path, *recorder_args: str) -> None:
        self.out = out
        self.args = recorder_args
        self.up: asyncio.subprocess.Process | None = None
        self.rec: asyncio.subprocess.Process | None = None
        self.url = ""
        self.stderr = b""

    async def __aenter__(self) -> Rig:
        self.up = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.faults.streamserver",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.up.stdout is not None
        up_url = (await asyncio.wait_for(self.up.stdout.readline(), 30)).decode().strip()
        self.rec = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_replay",
            "record",
            "--upstream",
            up_url,
            "--listen",
            "127.0.0.1:0",
            "-o",
            str(self.out),
            "--quiet",
            *self.args,
            cwd=ROOT,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.rec.stderr is not None
        self.url = (await asyncio.wait_for(self.rec.stderr.readline(), 30)).decode().split()[2]
        return self

    @property
    def pid(self) -> int:
        assert self.rec is not None
        return self.rec.pid

    async def stop(self) -> int:
        """SIGTERM the recorder; its exit code (its stderr in ``stderr``)."""
        assert self.rec is not None and self.rec.stderr is not None
        if self.rec.returncode is None:
            self.rec.terminate()
        self.stderr = await asyncio.wait_for(self.rec.stderr.read(), 60)
        return await asyncio.wait_for(self.rec.wait(), 60)

    async def __aexit__(self, *exc: object) -> None:
        if self.rec is not None and self.rec.returncode is None:
            await self.stop()
        if self.up is not None:
            self.up.kill()
            await self.up.wait()


async def stream(s: aiohttp.ClientSession, url: str, gaps: list[float], until: float) -> None:
    """Streams of 100 chunks 5 ms apart, one after another until ``until``; the gaps
    between the chunks as read (the first read of each response excluded)."""
    while time.monotonic() < until:
        async with s.post(url + "/v1/chat/completions", data=STREAM_BODY) as r:
            last = None
            async for _ in r.content.iter_any():
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now


async def post(
    s: aiohttp.ClientSession, url: str, name: str, data: bytes, encoding: str | None
) -> Posted:
    headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
    if encoding:
        headers["Content-Encoding"] = encoding
    t0 = time.monotonic()
    async with s.post(url + "/v1/chat/completions", data=slices(data), headers=headers) as r:
        body = await r.read()
    return Posted(name, r.status, body[:400], time.monotonic() - t0)


async def phase(
    rig: Rig,
    name: str,
    sends: list[tuple[str, bytes, str | None]],
    *,
    streams: int = 20,
    seconds: float = 3.0,
    delay: float = 0.5,
) -> Phase:
    """``streams`` live streams for ``seconds``; ``delay`` after they start, ``sends``
    are posted (name, body, Content-Encoding), all at once. The recorder's peak RSS over
    the phase, from its RSS at the start."""
    out = Phase(name)
    reset_peak(rig.pid)
    out.rss_before = rss_now(rig.pid)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        until = time.monotonic() + seconds
        live = [asyncio.create_task(stream(s, rig.url, out.gaps, until)) for _ in range(streams)]
        await asyncio.sleep(delay)
        out.posted = list(await asyncio.gather(*(post(s, rig.url, n, d, e) for n, d, e in sends)))
        await asyncio.gather(*live)
    out.rss_peak = rss_peak(rig.pid)
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")
