"""Benchmark of the simulated engine: SSE events per second per core, and schedule accuracy.

Run: .venv/bin/python benchmarks/bench_sim.py [--streams 200] [--tokens 300] [--workers 1]

1. Throughput: one sim process with a 2 ms decode step and N streams; a minimal raw-socket
   client in another process reads every byte. Reports events/s over wall time and per
   second of the sim process's own CPU time (user + system, psutil), i.e. per core.
   Baseline in the same run: the same client against a plain aiohttp server that writes
   pre-built events on a timer (no engine), as the reference cost of aiohttp + the socket.
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


def _client(host: str, port: int, streams: int, tokens: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
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


def throughput(streams: int, tokens: int, workers: int, step_ns: int) -> dict[str, float]:
    prof = json.loads((ROOT / "engines/sim/profiles/fast.json").read_text())
    prof.update(name="bench", decode_base_ns=step_ns, decode_per_seq_ns=0, eos_prob=0.0,
                spin_ns=300_000)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.json"
        path.write_text(json.dumps(prof))
        with SimProcess(str(path), workers=workers) as sim:
            pids = _server_pids(sim)
            q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
            c0 = _cpu(pids)
            proc = mp.Process(target=_client, args=("127.0.0.1", sim.port, streams, tokens, q))
            proc.start()
            events, wall = q.get()
            proc.join()
            cpu = _cpu(pids) - c0
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall,
            "events_per_cpu_s": events / cpu if cpu else float("nan")}


def accuracy(streams: int, tokens: int, profile: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        gt = Path(d) / "gt.parquet"
        with SimProcess(profile, ground_truth=gt) as sim:
            q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
            proc = mp.Process(target=_client, args=("127.0.0.1", sim.port, streams, tokens, q))
            proc.start()
            events, wall = q.get()
            proc.join()
        t = pq.read_table(gt)
    done = np.concatenate([np.asarray(x, dtype=np.int64) for x in t.column("chunk_ns").to_pylist()])
    sched = np.concatenate([np.asarray(x, dtype=np.int64) for x in t.column("chunk_scheduled_ns").to_pylist()])
    lag_us = (done - sched) / 1e3
    return {"chunks": float(len(lag_us)), "p50_us": float(np.percentile(lag_us, 50)),
            "p99_us": float(np.percentile(lag_us, 99)), "max_us": float(lag_us.max()),
            "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-us", type=int, default=2000, help="decode step of the throughput run")
    ap.add_argument("--profile", default="default", help="profile of the accuracy run")
    args = ap.parse_args()
    print(f"host: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    r = throughput(args.streams, args.tokens, args.workers, args.step_us * 1000)
    target = args.streams * 1e9 / (args.step_us * 1000)
    print("\nthroughput (one sim process per worker, raw-socket client in another process)")
    print(f"{'streams':>8} {'workers':>8} {'events':>9} {'wall s':>7} {'sim cpu s':>9} "
          f"{'events/s':>9} {'ev/cpu-s':>9} {'model ev/s':>10} {'achieved':>9}")
    print(f"{args.streams:>8} {args.workers:>8} {r['events']:>9.0f} {r['wall_s']:>7.2f} {r['cpu_s']:>9.2f} "
          f"{r['events_per_s']:>9.0f} {r['events_per_cpu_s']:>9.0f} {target:>10.0f} "
          f"{r['events_per_s'] / target:>9.2f}")
    a = accuracy(args.streams, min(args.tokens, 200), args.profile)
    print(f"\nschedule accuracy ({args.profile} profile, {args.streams} concurrent streams)")
    print(f"{'chunks':>8} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'p99 / 1 ms bound':>17}")
    print(f"{a['chunks']:>8.0f} {a['p50_us']:>8.0f} {a['p99_us']:>8.0f} {a['max_us']:>8.0f} "
          f"{a['p99_us'] / 1000:>17.2f}")


if __name__ == "__main__":
    main()
