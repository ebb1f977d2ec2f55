"""Benchmark: what the live dashboard costs the measuring loop.

A simulated measuring loop (asyncio) fires a timer at scheduled times, 1,000 per second; each
firing records its schedule lag and feeds one finished request (a synthetic row with ~80
chunks) to LiveStats. Every 250 ms it encodes a snapshot and offers it to a DashboardProcess
rendering full rich frames (forced terminal, into /dev/null). Modes, each in a fresh
subprocess, in one run:

  none       timer only
  stats      + LiveStats.observe_request and snapshot encoding
  dashboard  + DashboardProcess.update (the renderer runs in its own process)

Reported: worker CPU (process time of the measuring process / wall), schedule-lag P50/P99.
Targets: dashboard costs < 5% of a worker's CPU, schedule-lag P99 within 1 ms of 'none'.

    .venv/bin/python benchmarks/bench_dashboard.py [--seconds 10] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np


async def _loop(mode: str, seconds: float, rate: int) -> dict[str, float]:
    from analysis.dashboard import DashboardProcess
    from analysis.fixtures import synthetic_results
    from analysis.live import LiveStats

    rows = synthetic_results(512, seed=3).to_pylist()
    stats = LiveStats() if mode != "none" else None
    dash = None
    if mode == "dashboard":
        dash = DashboardProcess(total_requests=int(seconds * rate), title="bench", tty=True)
        dash.start()
        await asyncio.sleep(1.0)  # let the child start before measuring
    interval = 1_000_000_000 // rate
    lags = []
    start = time.perf_counter_ns()
    cpu0 = time.process_time_ns()
    next_snap = start + 250_000_000
    n = int(seconds * rate)
    for i in range(n):
        target = start + i * interval
        now = time.perf_counter_ns()
        if target > now:
            await asyncio.sleep((target - now) / 1e9)
            now = time.perf_counter_ns()
            while now < target:  # woke early: re-check the clock
                await asyncio.sleep(0)
                now = time.perf_counter_ns()
        lags.append(now - target)
        if stats is not None:
            stats.observe_request(rows[i % len(rows)])
            stats.observe_lag(now - target, None)
            if now >= next_snap:
                next_snap += 250_000_000
                stats.set_progress(i, n, 10, 10, now - start, 0.0)
                data = stats.encode()
                if dash is not None:
                    dash.update(data)
    wall = time.perf_counter_ns() - start
    cpu = time.process_time_ns() - cpu0
    if dash is not None:
        dash.stop()
    a = np.asarray(lags, dtype=np.float64)
    return {"cpu": cpu / wall * 100, "p50": float(np.percentile(a, 50)) / 1e6,
            "p99": float(np.percentile(a, 99)) / 1e6}


def child(mode: str, seconds: float, rate: int) -> None:
    res = asyncio.run(_loop(mode, seconds, rate))
    print("RESULT " + json.dumps(res), file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seconds, args.rate)
        return 0
    out: dict[str, list[dict[str, float]]] = {m: [] for m in ("none", "stats", "dashboard")}
    for _ in range(args.repeat):
        for mode in out:
            with open(os.devnull, "w") as null:
                proc = subprocess.run([sys.executable, __file__, "--child", mode, "--seconds",
                                       str(args.seconds), "--rate", str(args.rate)], check=True,
                                      stdout=null, stderr=subprocess.PIPE, text=True)
            line = [x for x in proc.stderr.splitlines() if x.startswith("RESULT ")][-1]
            out[mode].append(json.loads(line[len("RESULT "):]))
    base = out["none"]
    print(f"{args.rate} requests/s for {args.seconds:g} s, {args.repeat} rounds")
    print(f"{'mode':10s} {'worker CPU %':>22s} {'CPU - none (pp)':>16s} {'lag P50 ms':>11s} "
          f"{'lag P99 ms':>16s} {'P99 - none (ms)':>16s}")
    for mode, runs in out.items():
        cpus = [x["cpu"] for x in runs]
        p99 = [x["p99"] for x in runs]
        dcpu = [c - b["cpu"] for c, b in zip(cpus, base, strict=True)]
        dp99 = [p - b["p99"] for p, b in zip(p99, base, strict=True)]
        print(f"{mode:10s} {', '.join(f'{c:.1f}' for c in cpus):>22s} "
              f"{', '.join(f'{d:+.1f}' for d in dcpu):>16s} "
              f"{np.mean([x['p50'] for x in runs]):11.3f} {', '.join(f'{p:.3f}' for p in p99):>16s} "
              f"{', '.join(f'{d:+.3f}' for d in dp99):>16s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
