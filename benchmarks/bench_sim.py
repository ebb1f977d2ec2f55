"""Benchmark of the simulated engine: SSE events per second per core, and schedule accuracy.

Run: .venv/bin/python benchmarks/bench_sim.py [--streams 200] [--tokens 300] [--workers 1]

1. Throughput: one sim process with a 2 ms decode step and N streams; a minimal raw-socket
   client in another process reads every byte. Reports events/s over wall time and per
   second of the sim process's own CPU time (user + system, psutil), i.e. per core.
   Baseline in the same run: the same client against a plain aiohttp server with no engine,
   where each stream's handler awaits a shared step timer and writes a pre-built event with
   ``await resp.write`` (the idiomatic aiohttp way), as the reference cost per event.
2. Schedule accuracy: N concurrent streams on the `default` profile with --ground-truth;
   lag = (monotonic_ns right after the write) - (the step's scheduled deadline), p50/p99/max.
Figures are noisy on a shared 2-core machine: run more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_replay.engines.sim import SimProcess, SimProfile  # noqa: E402
from agent_replay.replay.provenance import code_version  # noqa: E402


async def _one_stream(host: str, port: int, body: bytes, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    req = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    ) + body
    writer.write(req)
    n = 0
    tail = b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        buf = tail + data
        n += buf.count(b"\n\n")
        tail = buf[-1:]
    counts.append(n)
    writer.close()


def _client(host: str, port: int, streams: int, tokens: int, out: mp.Queue) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    body = json.dumps(
        {"prompt": list(range(100, 164)), "max_tokens": tokens, "stream": True, "ignore_eos": True}
    ).encode()

    async def main() -> tuple[int, float]:
        counts: list[int] = []
        t0 = time.perf_counter()
        await asyncio.gather(*[_one_stream(host, port, body, counts) for _ in range(streams)])
        return sum(counts), time.perf_counter() - t0

    out.put(asyncio.run(main()))


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _server_pids(sim: SimProcess) -> list[int]:
    assert sim.proc is not None
    p = psutil.Process(sim.proc.pid)
    return [p.pid] + [c.pid for c in p.children(recursive=True)]


EVENT = (
    b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" abcd","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}\n\n'
)


def serve_baseline(step_ns: int) -> None:
    """A plain aiohttp SSE server without an engine (the baseline); prints its port."""
    import uvloop
    from aiohttp import web

    async def serve() -> None:
        tick: list[asyncio.Future[None]] = [asyncio.get_running_loop().create_future()]

        async def ticker() -> None:
            nxt = time.monotonic_ns()
            while True:
                nxt += step_ns
                await asyncio.sleep(max(0, nxt - time.monotonic_ns()) / 1e9)
                fut, tick[0] = tick[0], asyncio.get_running_loop().create_future()
                fut.set_result(None)

        async def handler(request: web.Request) -> web.StreamResponse:
            body = json.loads(await request.read())
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(body["max_tokens"]):
                await tick[0]
                await resp.write(EVENT)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        task = asyncio.get_running_loop().create_task(ticker())
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()
        task.cancel()

    uvloop.install()
    asyncio.run(serve())


async def _sleep_until(deadline: int, spin: int) -> None:
    """The engine loop's wait (engines/sim/server.py): sleep, then yield until the deadline."""
    while True:
        rem = deadline - time.monotonic_ns()
        if rem <= 0:
            return
        await asyncio.sleep((rem - spin) / 1e9 if rem > spin else 0)


def serve_bare(step_ns: int, spin_ns: int, out: str) -> None:
    """The floor for one Python process: an asyncio server with no engine that, at every
    step deadline, writes one pre-framed event to every open stream and takes
    ``monotonic_ns()`` after each write, as the sim does. With ``--timer-only`` semantics
    (port 0 streams) it is a bare timer. Prints its port; on SIGTERM saves the lags of
    every write (ns) and the first write of each step to ``out`` (.npz)."""
    import signal

    import uvloop

    framed = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    streams: list[list[Any]] = []  # [transport, tokens left]

    class Conn(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""
            self.tr: Any = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.tr = transport

        def data_received(self, data: bytes) -> None:
            self.buf += data
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = int(self.buf.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(self.buf) < head_end + 4 + length:
                return
            tokens = json.loads(self.buf[head_end + 4 : head_end + 4 + length])["max_tokens"]
            self.tr.write(head)
            streams.append([self.tr, tokens])

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        server = await loop.create_server(Conn, "127.0.0.1", 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        lags: list[int] = []
        first: list[int] = []
        deadline = time.monotonic_ns()
        while not stop.is_set():
            deadline += step_ns
            await _sleep_until(deadline, spin_ns)
            first.append(time.monotonic_ns() - deadline)
            for st in streams:
                st[0].write(framed)
                lags.append(time.monotonic_ns() - deadline)
                st[1] -= 1
                if st[1] == 0:
                    st[0].write(b"0\r\n\r\n")
                    st[0].close()
            streams[:] = [st for st in streams if st[1] > 0]
        np.savez(
            out, lags=np.asarray(lags, dtype=np.int64), first=np.asarray(first, dtype=np.int64)
        )

    uvloop.run(serve())


def _measure(pids: list[int], port: int, streams: int, tokens: int) -> dict[str, float]:
    q: mp.Queue = mp.Queue()
    c0 = _cpu(pids)
    client = mp.Process(target=_client, args=("127.0.0.1", port, streams, tokens, q))
    client.start()
    events, wall = q.get()
    client.join()
    cpu = _cpu(pids) - c0
    return {
        "events": events,
        "wall_s": wall,
        "cpu_s": cpu,
        "events_per_s": events / wall,
        "events_per_cpu_s": events / cpu if cpu else float("nan"),
    }


def baseline(streams: int, tokens: int, step_ns: int) -> dict[str, float]:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-baseline", str(step_ns)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return _measure([proc.pid], port, streams, tokens)
    finally:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def throughput(streams: int, tokens: int, workers: int, step_ns: int) -> dict[str, float]:
    prof = json.loads((ROOT / "engines/sim/profiles/fast.json").read_text())
    prof.update(
        name="bench", decode_base_ns=step_ns, decode_per_seq_ns=0, eos_prob=0.0, spin_ns=300_000
    )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.json"
        path.write_text(json.dumps(prof))
        with SimProcess(str(path), workers=workers) as sim:
            return _measure(_server_pids(sim), sim.port, streams, tokens)


def _lag_stats(
    lags: np.ndarray,
    first: np.ndarray,
    spread: np.ndarray | None,
    wall_s: float,
    per_step: np.ndarray | None = None,
) -> dict[str, float]:
    def q(v: np.ndarray, x: float) -> float:
        return float(np.percentile(v, x)) / 1e3 if len(v) else float("nan")

    return {
        "writes": float(len(lags)),
        "p50_us": q(lags, 50),
        "p99_us": q(lags, 99),
        "max_us": float(lags.max()) / 1e3 if len(lags) else float("nan"),
        "first_p99_us": q(first, 99),
        "spread_p99_us": q(spread, 99) if spread is not None else float("nan"),
        "write_us": (
            float(np.median(spread / np.maximum(per_step - 1, 1))) / 1e3
            if spread is not None and per_step is not None and len(spread)
            else float("nan")
        ),
        "wall_s": wall_s,
    }


def _start_bare(step_ns: int, spin_ns: int, out: Path) -> tuple[Any, int]:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-bare", str(step_ns), str(spin_ns), str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _stop_bare(proc: Any, out: Path) -> tuple[np.ndarray, np.ndarray]:
    import signal

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    proc.stdout.close()
    data = np.load(out)
    return data["lags"], data["first"]


def accuracy(
    streams: int, tokens: int, profile: str, workers: int
) -> list[tuple[str, dict[str, float]]]:
    """The sim's write lag, a bare timer's lag at the same moments, and the write lag of a
    bare writer (no engine) serving the same client at the sim's median step interval."""
    spin = SimProfile.load(profile).spin_ns
    with tempfile.TemporaryDirectory() as d:
        gt = Path(d) / "gt.parquet"
        timer, _ = _start_bare(10_000_000, spin, Path(d) / "timer.npz")
        with SimProcess(profile, ground_truth=gt, workers=workers) as sim:
            r = _measure(_server_pids(sim), sim.port, streams, tokens)
        _, timer_first = _stop_bare(timer, Path(d) / "timer.npz")
        files = [gt] if workers == 1 else sorted(Path(d).glob("gt.w*.parquet"))
        tables = [pq.read_table(f).to_pylist() for f in files]
        rows = [row for t in tables for row in t]
        # each worker is its own engine: its own steps
        intervals = [
            np.median(
                np.diff(
                    np.unique(
                        np.concatenate(
                            [np.asarray(x["chunk_scheduled_ns"], dtype=np.int64) for x in t]
                        )
                    )
                )
            )
            for t in tables
            if t
        ]
        interval = int(np.median(intervals)) if intervals else 10_000_000
        done = np.concatenate([np.asarray(x["chunk_ns"], dtype=np.int64) for x in rows])
        sched = np.concatenate([np.asarray(x["chunk_scheduled_ns"], dtype=np.int64) for x in rows])
        lags = done - sched
        steps, inv = np.unique(sched, return_inverse=True)
        first = np.full(len(steps), np.iinfo(np.int64).max)
        last = np.full(len(steps), np.iinfo(np.int64).min)
        np.minimum.at(first, inv, lags)
        np.maximum.at(last, inv, lags)
        out = [
            (
                f"sim, {workers} worker(s)",
                _lag_stats(lags, first, last - first, r["wall_s"], np.bincount(inv)),
            ),
            ("bare timer, same moments", _lag_stats(timer_first, timer_first, None, r["wall_s"])),
        ]
        bare, port = _start_bare(interval, spin, Path(d) / "bare.npz")
        r = _measure([bare.pid], port, streams, tokens)
        lags, first = _stop_bare(bare, Path(d) / "bare.npz")
        # a step of the bare writer: one first-write entry; its writes follow in order
        spread, per_step = _bare_spread(lags)
        out.append(
            (
                f"bare writer, {interval / 1e6:.1f} ms steps",
                _lag_stats(lags, first, spread, r["wall_s"], per_step),
            )
        )
    return out


def _bare_spread(lags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, last write lag - first write lag (a new step starts where the lag drops),
    and the writes of each step."""
    if not len(lags):
        return lags, lags
    starts = np.flatnonzero(np.r_[True, np.diff(lags) < 0])
    ends = np.r_[starts[1:], len(lags)] - 1
    return lags[ends] - lags[starts], ends - starts + 1


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-baseline":
        serve_baseline(int(sys.argv[2]))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-bare":
        serve_bare(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-us", type=int, default=2000, help="decode step of the throughput run")
    ap.add_argument("--profile", default="default", help="profile of the accuracy run")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    print(
        f"commit {code_version()}; host: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}"
    )
    step_ns = args.step_us * 1000
    target = args.streams * 1e9 / step_ns
    rows = [("sim", args.workers, throughput(args.streams, args.tokens, args.workers, step_ns))]
    if not args.skip_baseline:
        rows.append(("baseline", 1, baseline(args.streams, args.tokens, step_ns)))
    ref = rows[-1][2]["events_per_cpu_s"]
    print(
        f"\nthroughput: {args.streams} streams x {args.tokens} tokens, one event per "
        f"{args.step_us} us step (model rate {target:,.0f} events/s); raw-socket client in "
        "another process; cpu = the server's user + system seconds"
    )
    print(
        f"{'server':>9} {'workers':>7} {'events':>8} {'wall s':>7} {'cpu s':>6} {'events/s':>9} "
        f"{'ev/cpu-s':>9} {'vs base':>8}"
    )
    for name, w, r in rows:
        print(
            f"{name:>9} {w:>7} {r['events']:>8.0f} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} "
            f"{r['events_per_s']:>9,.0f} {r['events_per_cpu_s']:>9,.0f} "
            f"{r['events_per_cpu_s'] / ref:>8.2f}"
        )
    acc = accuracy(args.streams, min(args.tokens, 200), args.profile, args.workers)
    print(
        f"\nschedule accuracy: {args.profile} profile, {args.streams} concurrent streams; "
        "lag = monotonic_ns() after the write - the step's deadline; first = the first write "
        "of a step (wake-up); spread = last - first write of a step; us/write = median of "
        "spread / (writes in the step - 1); baseline = bare writer"
    )
    ref = acc[-1][1]["p99_us"]
    print(
        f"{'server':<28}{'writes':>8}{'p50 us':>8}{'p99 us':>8}{'max us':>8}{'first p99':>10}"
        f"{'spread p99':>11}{'us/write':>9}{'p99/base':>9}{'p99/1ms':>8}"
    )
    for name, a in acc:
        print(
            f"{name:<28}{a['writes']:>8.0f}{a['p50_us']:>8.0f}{a['p99_us']:>8.0f}"
            f"{a['max_us']:>8.0f}{a['first_p99_us']:>10.0f}{a['spread_p99_us']:>11.0f}"
            f"{a['write_us']:>9.1f}"
            f"{a['p99_us'] / ref:>9.2f}{a['p99_us'] / 1000:>8.2f}"
        )


if __name__ == "__main__":
    main()
