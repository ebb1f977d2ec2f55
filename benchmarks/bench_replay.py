"""Benchmark of the replay runtime against the simulated engine.

    python benchmarks/bench_replay.py [--rate 120] [--seconds 15] [--sim-workers 4]
                                      [--capacity-workers 1 2 4] [--mooncake PATH] [--out DIR]

A. Streaming capacity: requests of 256 output tokens (one token per chunk, the sim's
   ``fast`` profile: 1 ms per step) arrive uniformly at ``--rate`` per second per worker in
   ``absolute`` timing, so the offered load is about rate x 256 chunks/s per worker. For 1
   and 2 workers (``--capacity-workers``) it reports chunks/s delivered, schedule-lag and loop-lag p99, and the
   client's CPU microseconds per chunk (all its processes; the number that transfers to
   bigger machines; process start-up and plan building excluded). The baseline, measured in the same run at the same load: a null
   client (aiohttp, reads the stream, counts events, no timestamps, no JSON, no results).
C. Session timing (``--session-trace``, default the bundled agent-medium sample) at
   ``--session-speedup``: think-time error = s - (parent end + think) of every child
   request, p50/p99/max, and the number of requests that left before their parent
   completed plus their think time (must be 0).
B. Timing fidelity on real arrivals: the first 10 minutes of the Mooncake conversation
   trace (read directly from its JSONL) at --speedup 10 in ``absolute`` timing:
   |actual send - intended| p50/p99/max.

Figures are noisy on shared machines: run it more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_replay.engines.sim import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.provenance import code_version
from agent_replay.replay.run import run
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

OUT_TOKENS = 256
IN_TOKENS = 128


def uniform_trace(path: Path, rate: float, seconds: float) -> Path:
    n = int(rate * seconds)
    gap = int(1e9 / rate)
    table = pa.table(
        {
            "session_id": [f"u{i}" for i in range(n)],
            "request_index": [0] * n,
            "parent_index": [-1] * n,
            "arrival_ns": [i * gap for i in range(n)],
            "input_tokens": [IN_TOKENS] * n,
            "output_tokens": [OUT_TOKENS] * n,
            "hash_ids": [[i * 100 + b for b in range(8)] for i in range(n)],
        }
    )
    return write_trace(table, path, TraceMeta(block_size=16), force=True)


def mooncake_slice(src: Path, dst: Path, minutes: float = 10.0) -> Path:
    rows = []
    with open(src) as fh:
        for line in fh:
            r = json.loads(line)
            if r["timestamp"] >= minutes * 60_000:
                break
            rows.append(r)
    n = len(rows)
    table = pa.table(
        {
            "session_id": [f"m{i}" for i in range(n)],
            "request_index": [0] * n,
            "parent_index": [-1] * n,
            "arrival_ns": [int(r["timestamp"]) * 1_000_000 for r in rows],
            "input_tokens": [int(r["input_length"]) for r in rows],
            "output_tokens": [max(1, int(r["output_length"])) for r in rows],
            "hash_ids": [r["hash_ids"] for r in rows],
        }
    )
    return write_trace(
        table, dst, TraceMeta(block_size=512, source="imported:mooncake"), force=True
    )


def replay_figures(out: Path, summary) -> dict:  # type: ignore[no-untyped-def]
    t = pq.read_table(
        out / "requests", columns=["sent_ns", "intended_ns", "end_ns", "chunk_tokens"]
    ).to_pydict()
    sent = np.array(t["sent_ns"], dtype=np.int64)
    end = np.array(t["end_ns"], dtype=np.int64)
    lag = sent - np.array(t["intended_ns"], dtype=np.int64)
    chunks = summary.chunks
    span = (end.max() - sent.min()) / 1e9
    loop = np.concatenate([w.loop_lag_ns() for w in summary.workers])
    return {
        "requests": summary.ok,
        "failed": summary.failed,
        "chunks": chunks,
        "chunks_per_s": chunks / span,
        "lag_p50_ms": np.percentile(np.abs(lag), 50) / 1e6,
        "lag_p99_ms": np.percentile(np.abs(lag), 99) / 1e6,
        "lag_max_ms": np.abs(lag).max() / 1e6,
        "loop_p99_ms": np.percentile(loop, 99) / 1e6 if loop.size else float("nan"),
        "cpu_us_per_chunk": sum(w.cpu_run_s for w in summary.workers) / max(chunks, 1) * 1e6,
        "cpu_cores": summary.cpu_s / max(summary.wall_s, 1e-9),
        "mismatches": summary.mismatches,
    }


async def null_client(url: str, n: int, concurrency: int) -> tuple[int, float]:
    """Baseline: stream n requests, count events only. Returns (events, cpu seconds)."""
    body = json.dumps(
        {
            "model": "sim-fast",
            "prompt": list(range(1000, 1000 + IN_TOKENS)),
            "max_tokens": OUT_TOKENS,
            "min_tokens": OUT_TOKENS,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    events = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(s: aiohttp.ClientSession) -> None:
        nonlocal events
        async with (
            sem,
            s.post(
                url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            ) as r,
        ):
            while True:
                data = await r.content.readany()
                if not data:
                    break
                events += data.count(b"\n\n")

    t = os.times()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(s) for _ in range(n)))
    t2 = os.times()
    return events, (t2.user + t2.system) - (t.user + t.system)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=120.0, help="requests/s per worker")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--sim-workers", type=int, default=4)
    ap.add_argument(
        "--mooncake",
        default=str(
            Path(__file__).resolve().parents[2]
            / "shared"
            / "data"
            / "mooncake"
            / "conversation_trace.jsonl"
        ),
    )
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument(
        "--capacity-workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="worker counts for part A, each offered --rate x workers (the first is "
        "the baseline of the scaling ratios)",
    )
    ap.add_argument("--mooncake-workers", type=int, nargs="+", default=[1])
    ap.add_argument(
        "--session-trace",
        default=str(
            Path(__file__).resolve().parents[1] / "traces" / "samples" / "agent-medium.parquet"
        ),
    )
    ap.add_argument("--session-speedup", type=float, default=4.0)
    args = ap.parse_args()
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, SimProcess("fast", workers=args.sim_workers) as sim:
        tmpd = Path(tmp)
        if not args.skip_capacity:
            for workers in args.capacity_workers:
                trace = uniform_trace(
                    tmpd / f"u{workers}.parquet", args.rate * workers, args.seconds
                )
                out = tmpd / f"res{workers}"
                s = run(
                    RunConfig(
                        trace=str(trace),
                        target=sim.url,
                        output=str(out),
                        timing="absolute",
                        workers=workers,
                        salt=workers,
                        scrape_interval_s=0,
                    ),
                    progress=None,
                )
                figures[f"replay_{workers}w"] = replay_figures(out, s)
            n = int(args.rate * args.seconds)
            conc = max(1, int(args.rate * OUT_TOKENS / 1000 * 1.2))
            t0 = time.monotonic()
            ev, cpu = asyncio.run(null_client(sim.url, n, conc))
            wall = time.monotonic() - t0
            figures["null_client_1w"] = {
                "chunks": ev,
                "chunks_per_s": ev / wall,
                "cpu_us_per_chunk": cpu / max(ev, 1) * 1e6,
            }
        moon = Path(args.mooncake)
        if moon.exists():
            trace = mooncake_slice(moon, tmpd / "moon.parquet")
            for w in args.mooncake_workers:
                out = tmpd / f"moon{w}"
                s = run(
                    RunConfig(
                        trace=str(trace),
                        target=sim.url,
                        output=str(out),
                        timing="absolute",
                        speedup=10,
                        salt=3 + w,
                        workers=w,
                        scrape_interval_s=0,
                    ),
                    progress=None,
                )
                figures[f"mooncake_10min_x10_{w}w"] = replay_figures(out, s)
        else:
            print(f"(Mooncake trace not found at {moon}: part B skipped)")
        if Path(args.session_trace).exists():
            out = tmpd / "session"
            s = run(
                RunConfig(
                    trace=args.session_trace,
                    target=sim.url,
                    output=str(out),
                    speedup=args.session_speedup,
                    salt=9,
                    scrape_interval_s=0,
                ),
                progress=None,
            )
            f = replay_figures(out, s)
            t = pq.read_table(
                out / "requests", columns=["sent_ns", "parent_end_ns", "think_ns"]
            ).to_pydict()
            err = np.array(
                [
                    sn - (pe + th)
                    for sn, pe, th in zip(
                        t["sent_ns"], t["parent_end_ns"], t["think_ns"], strict=True
                    )
                    if pe is not None and th is not None and sn is not None
                ],
                dtype=np.int64,
            )
            f.update(
                {
                    "children": int(err.size),
                    "early": int((err < 0).sum()),
                    "think_err_p50_ms": float(np.percentile(err, 50) / 1e6),
                    "think_err_p99_ms": float(np.percentile(err, 99) / 1e6),
                    "think_err_max_ms": float(err.max() / 1e6),
                }
            )
            figures[f"session_x{args.session_speedup:g}"] = f
    cols = [
        "requests",
        "failed",
        "chunks",
        "chunks_per_s",
        "lag_p50_ms",
        "lag_p99_ms",
        "lag_max_ms",
        "loop_p99_ms",
        "cpu_us_per_chunk",
        "cpu_cores",
        "mismatches",
    ]
    print(f"{'run':22s} " + " ".join(f"{c:>16s}" for c in cols))
    for name, f in figures.items():
        print(
            f"{name:22s} "
            + " ".join(
                f"{f[c]:16.3f}" if isinstance(f.get(c), float) else f"{f.get(c, ''):>16}"
                for c in cols
            )
        )
    if not args.skip_capacity and len(args.capacity_workers) > 1:
        w0 = args.capacity_workers[0]
        base = figures[f"replay_{w0}w"]["chunks_per_s"]
        for w in args.capacity_workers[1:]:
            r = figures[f"replay_{w}w"]["chunks_per_s"] / base
            print(
                f"{w} workers / {w0}, chunks/s: {r:.2f}x (ideal {w / w0:.2f}x, "
                f"{r / (w / w0):.2f} of it); schedule lag p99 "
                f"{figures[f'replay_{w}w']['lag_p99_ms']:.2f} ms"
            )
    if "null_client_1w" in figures and "replay_1w" in figures:
        r = figures["replay_1w"]["cpu_us_per_chunk"] / figures["null_client_1w"]["cpu_us_per_chunk"]
        print(f"replay CPU per chunk / null client CPU per chunk: {r:.2f}x")
    for name, f in figures.items():
        if "children" in f:
            print(
                f"{name}: {f['children']} child requests, {f['early']} left before parent end + think; "
                f"think-time error p50 {f['think_err_p50_ms']:.3f} ms, p99 {f['think_err_p99_ms']:.3f} ms, "
                f"max {f['think_err_max_ms']:.3f} ms"
            )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"commit": code_version(), "figures": figures}, indent=2)
        )


if __name__ == "__main__":
    main()
