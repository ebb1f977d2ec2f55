"""How long the recorder's part writes hold up its event loop.

A uvloop loop sleeps 1 ms at a time and records how late it wakes (its lag), while a
thread of the same process writes part files the way the recorder's flush does
(``sink.PartWriter``: rows to Arrow, Parquet with zstd, fsync, rename), one every
``--every`` seconds. Lags are split by whether a write was under way. Where the writer
thread runs:

* ``--cpus same``: on the loop's CPU (as with ``bench_proxy --pin``, where every thread of
  the recorder shares one CPU): the write's native parts (Arrow, zstd, fsync) compete
  with the loop for the CPU as well as its Python parts for the GIL;
* ``--cpus split``: on another CPU: only the GIL is shared.

``--policy idle`` runs the writer thread under ``SCHED_IDLE`` (Linux), which any
runnable normal thread preempts; ``--policy nice`` at nice 19. ``--hog SHARE`` keeps
another process busy on the loop's CPU that share of the time: a ``SCHED_IDLE`` writer
then gets the CPU only when nothing else wants it, also while it holds the GIL the loop
waits for.

    .venv/bin/python benchmarks/bench_flush_lag.py --cpus same --policy normal
    .venv/bin/python benchmarks/bench_flush_lag.py --cpus same --policy idle
    .venv/bin/python benchmarks/bench_flush_lag.py --cpus same --policy idle --hog 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_replay.replay.record.recorder import SWITCH_INTERVAL_S
from agent_replay.replay.record.sink import PartWriter
from agent_replay.traces.schema import TraceMeta


def rows(n: int, chunks: int) -> list[dict[str, Any]]:
    """``n`` rows like a recorded completions stream of ``chunks`` chunks."""
    return [
        {
            "session_id": f"s{i}",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": i,
            "think_ns": 0,
            "input_tokens": 32,
            "output_tokens": chunks,
            "api": "completions",
            "model": "sim-8b",
            "hash_ids": list(range(1, 2)),
            "ttft_ns": 40_000_000,
            "end_ns": 20_000_000 * chunks,
            "chunk_gaps_ns": [20_000_000] * chunks,
            "chunk_tokens": [1] * chunks,
            "http_status": 200,
            "stream": True,
            "upstream_send_ns": 100_000,
            "headers_ns": 900_000,
            "exact_chunk_tokens": True,
        }
        for i in range(n)
    ]


HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
while True:
    end = time.perf_counter() + float(sys.argv[3])
    while time.perf_counter() < end:
        pass
    time.sleep(float(sys.argv[2]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", choices=("same", "split"), default="same")
    ap.add_argument("--policy", choices=("normal", "idle", "nice"), default="normal")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=0.05, help="seconds between writes")
    ap.add_argument("--rows", type=int, default=15, help="rows per part")
    ap.add_argument(
        "--hog",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="another process busy on the loop's CPU this share of the time "
        "(in 10 ms periods; 0: none)",
    )
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs 2 CPUs")
    loop_cpu, other_cpu = cpus[1], cpus[0]
    os.sched_setaffinity(0, {loop_cpu})
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as the recorder sets it
    batch = rows(args.rows, 128)
    hog = None
    if args.hog:
        on = 0.01 * args.hog
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(loop_cpu), str(0.01 - on), str(on)])
    meta = TraceMeta(
        block_size=64,
        source="recorded",
        content_mode="hashed",
        tokenizer=None,
        start_wall_ns=0,
        tool_version="bench",
        extra={},
    )
    busy = threading.Event()
    stop = threading.Event()
    write_ms: list[float] = []

    with tempfile.TemporaryDirectory() as tmp:
        writer = PartWriter(Path(tmp))

        def flush_thread() -> None:
            tid = threading.get_native_id()
            if args.cpus == "split":
                os.sched_setaffinity(tid, {other_cpu})
            if args.policy == "idle":
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            elif args.policy == "nice":
                os.setpriority(os.PRIO_PROCESS, tid, 19)
            while not stop.is_set():
                busy.set()
                t0 = time.perf_counter()
                writer.write(batch, meta)
                write_ms.append((time.perf_counter() - t0) * 1e3)
                busy.clear()
                stop.wait(args.every)

        async def measure() -> tuple[list[int], list[int]]:
            during: list[int] = []
            between: list[int] = []
            thread = threading.Thread(target=flush_thread)
            thread.start()
            end = time.perf_counter_ns() + int(args.seconds * 1e9)
            try:
                while time.perf_counter_ns() < end:
                    was = busy.is_set()
                    t0 = time.perf_counter_ns()
                    await asyncio.sleep(0.001)
                    lag = time.perf_counter_ns() - t0 - 1_000_000
                    (during if was or busy.is_set() else between).append(lag)
            finally:
                stop.set()
                thread.join()
            return during, between

        import uvloop

        try:
            during, between = uvloop.run(measure())
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(
        f"writer on {'the loop' if args.cpus == 'same' else 'another'} CPU, policy "
        f"{args.policy}{f', a process busy {args.hog:.0%} beside' if args.hog else ''}; {len(write_ms)} parts of {args.rows} rows, write wall p50 "
        f"{np.percentile(write_ms, 50):.2f} ms; load average {os.getloadavg()[0]:.1f}"
    )
    for name, v in (("while writing", during), ("between writes", between)):
        a = np.asarray(v, dtype=np.int64) / 1e6
        print(
            f"loop lag {name:<15} n {len(a):>6}  p50 {np.percentile(a, 50):6.3f}  "
            f"p99 {np.percentile(a, 99):6.3f}  max {a.max():6.3f} ms"
        )


if __name__ == "__main__":
    main()
