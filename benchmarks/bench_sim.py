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

import numpy as np
import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.sim import SimProcess  # noqa: E402


async def _one_stream(host: str, port: int, body: bytes, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
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
    body = json.dumps({"prompt": list(range(100, 164)), "max_tokens": tokens, "stream": True,
                       "ignore_eos": True}).encode()

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


EVENT = (b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1,"model":"m",'
         b'"choices":[{"index":0,"text":" abcd","logprobs":null,"finish_reason":null,'
         b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}\n\n')


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


def _measure(pids: list[int], port: int, streams: int, tokens: int) -> dict[str, float]:
    q: mp.Queue = mp.Queue()
    c0 = _cpu(pids)
    client = mp.Process(target=_client, args=("127.0.0.1", port, streams, tokens, q))
    client.start()
    events, wall = q.get()
    client.join()
    cpu = _cpu(pids) - c0
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall,
            "events_per_cpu_s": events / cpu if cpu else float("nan")}


def baseline(streams: int, tokens: int, step_ns: int) -> dict[str, float]:
    import subprocess

    proc = subprocess.Popen([sys.executable, __file__, "--serve-baseline", str(step_ns)],
                            stdout=subprocess.PIPE, text=True)
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
    prof.update(name="bench", decode_base_ns=step_ns, decode_per_seq_ns=0, eos_prob=0.0,
                spin_ns=300_000)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.json"
        path.write_text(json.dumps(prof))
        with SimProcess(str(path), workers=workers) as sim:
            return _measure(_server_pids(sim), sim.port, streams, tokens)


def accuracy(streams: int, tokens: int, profile: str, workers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        gt = Path(d) / "gt.parquet"
        with SimProcess(profile, ground_truth=gt, workers=workers) as sim:
            r = _measure(_server_pids(sim), sim.port, streams, tokens)
        files = [gt] if workers == 1 else sorted(Path(d).glob("gt.w*.parquet"))
        rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    done = np.concatenate([np.asarray(x["chunk_ns"], dtype=np.int64) for x in rows])
    sched = np.concatenate([np.asarray(x["chunk_scheduled_ns"], dtype=np.int64) for x in rows])
    lag_us = (done - sched) / 1e3
    return {"chunks": float(len(lag_us)), "p50_us": float(np.percentile(lag_us, 50)),
            "p99_us": float(np.percentile(lag_us, 99)), "max_us": float(lag_us.max()),
            "wall_s": r["wall_s"]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-baseline":
        serve_baseline(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-us", type=int, default=2000, help="decode step of the throughput run")
    ap.add_argument("--profile", default="default", help="profile of the accuracy run")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    print(f"host: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    step_ns = args.step_us * 1000
    target = args.streams * 1e9 / step_ns
    rows = [("sim", args.workers, throughput(args.streams, args.tokens, args.workers, step_ns))]
    if not args.skip_baseline:
        rows.append(("baseline", 1, baseline(args.streams, args.tokens, step_ns)))
    ref = rows[-1][2]["events_per_cpu_s"]
    print(f"\nthroughput: {args.streams} streams x {args.tokens} tokens, one event per "
          f"{args.step_us} us step (model rate {target:,.0f} events/s); raw-socket client in "
          "another process; cpu = the server's user + system seconds")
    print(f"{'server':>9} {'workers':>7} {'events':>8} {'wall s':>7} {'cpu s':>6} {'events/s':>9} "
          f"{'ev/cpu-s':>9} {'vs base':>8}")
    for name, w, r in rows:
        print(f"{name:>9} {w:>7} {r['events']:>8.0f} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} "
              f"{r['events_per_s']:>9,.0f} {r['events_per_cpu_s']:>9,.0f} "
              f"{r['events_per_cpu_s'] / ref:>8.2f}")
    a = accuracy(args.streams, min(args.tokens, 200), args.profile, args.workers)
    print(f"\nschedule accuracy: {args.profile} profile, {args.streams} concurrent streams, "
          f"{args.workers} worker(s); lag = write done - scheduled deadline")
    print(f"{'chunks':>8} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'p99 / 1 ms':>11}")
    print(f"{a['chunks']:>8.0f} {a['p50_us']:>8.0f} {a['p99_us']:>8.0f} {a['max_us']:>8.0f} "
          f"{a['p99_us'] / 1000:>11.2f}")


if __name__ == "__main__":
    main()
