"""Benchmark: what live statistics and the dashboard cost the measuring loop.

A simulated measuring loop (asyncio) fires a timer at scheduled times, 1,000 per second; each
firing records its schedule lag and feeds one finished request (a synthetic row with ~80
chunks whose times and token counts are ``array.array``s, as the replay client records them)
to LiveStats. Every ``--snapshot-ms`` (default: analysis.live.SNAPSHOT_INTERVAL_NS) it encodes
a snapshot and offers it to a DashboardProcess rendering full rich frames (forced terminal,
into /dev/null). Modes, each in a fresh subprocess:

  none       timer only
  stats      + LiveStats.observe_request / observe_lag and snapshot encoding
  dashboard  + DashboardProcess.update (the renderer runs in its own process)

The machine is shared and noisy, so modes are interleaved round by round (in a rotating
order) and every mode is compared with the 'none' run of its own round. Reported per mode:
schedule-lag P99 of each round, the median over rounds of P99 and of P99 minus 'none' in the
same round, worker CPU (process time of the measuring process / wall) and its excess over
'none', the median and longest snapshot (flush + encode + update) on the loop, and the
renderer's own CPU while measuring (% of one core). Targets: the dashboard raises
schedule-lag P99 by <= 1 ms and costs < 5% of a worker's CPU.

    .venv/bin/python benchmarks/bench_dashboard.py [--seconds 8] [--repeat 3]
        [--snapshot-ms 1000] [--rows arrays|lists] [--other-tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from array import array
from typing import Any

import numpy as np

MODES = ("none", "stats", "dashboard")


def _rows(kind: str) -> list[dict[str, Any]]:
    from analysis.fixtures import synthetic_results

    rows = synthetic_results(512, seed=3).to_pylist()
    if kind == "arrays":
        for r in rows:
            r["chunk_ns"] = array("q", r["chunk_ns"] or ())
            r["chunk_tokens"] = array("i", r["chunk_tokens"] or ())
    return rows


async def _loop(mode: str, seconds: float, rate: int, snapshot_ns: int,
                kind: str) -> dict[str, float]:
    from analysis.dashboard import DashboardProcess
    from analysis.live import LiveStats

    rows = _rows(kind)
    stats = LiveStats() if mode != "none" else None
    dash = None
    if mode == "dashboard":
        dash = DashboardProcess(total_requests=int(seconds * rate), title="bench", tty=True)
        dash.start()
        await asyncio.sleep(1.5)  # let the child start (imports) before measuring
    render0 = _cpu_of(dash)
    interval = 1_000_000_000 // rate
    lags = []
    snaps = [0]
    start = time.perf_counter_ns()
    cpu0 = time.process_time_ns()
    next_snap = start + snapshot_ns
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
                next_snap += snapshot_ns
                stats.set_progress(i, n, 10, 10, now - start, 0.0)
                data = stats.encode()
                if dash is not None:
                    dash.update(data)
                snaps.append(time.perf_counter_ns() - now)
    wall = time.perf_counter_ns() - start
    cpu = time.process_time_ns() - cpu0
    render_cpu = (_cpu_of(dash) - render0) / wall * 100 if dash is not None else float("nan")
    if dash is not None:
        dash.stop()
    a = np.asarray(lags, dtype=np.float64)
    return {"cpu": cpu / wall * 100, "p50": float(np.percentile(a, 50)) / 1e6,
            "p99": float(np.percentile(a, 99)) / 1e6,
            "p999": float(np.percentile(a, 99.9)) / 1e6,
            "snap_med": float(np.median(snaps[1:] or [0])) / 1e6, "snap_max": max(snaps) / 1e6,
            "render_cpu": render_cpu}


def _cpu_of(dash: Any) -> int:
    """CPU time (ns) the dashboard's renderer process has used so far."""
    if dash is None:
        return 0
    import psutil

    t = psutil.Process(dash._proc.pid).cpu_times()
    return int((t.user + t.system) * 1e9)


def child(mode: str, seconds: float, rate: int, snapshot_ns: int, kind: str) -> None:
    res = asyncio.run(_loop(mode, seconds, rate, snapshot_ns, kind))
    print("RESULT " + json.dumps(res), file=sys.stderr, flush=True)


def _fmt(xs: list[float], spec: str) -> str:
    return ", ".join(format(x, spec) for x in xs)


def main() -> int:
    if os.environ.get("AGENT_REPLAY_BENCH_TREE"):  # a child measuring another source tree
        sys.path.insert(0, os.environ["AGENT_REPLAY_BENCH_TREE"])
    from analysis import live

    default_ns = getattr(live, "SNAPSHOT_INTERVAL_NS", 250_000_000)

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--snapshot-ms", type=float, default=default_ns / 1e6)
    ap.add_argument("--rows", choices=("arrays", "lists"), default="arrays",
                    help="chunk columns as array.array (replay client) or Python lists")
    ap.add_argument("--other-tree", help="also run stats and dashboard with this source tree "
                    "first on sys.path (e.g. a git worktree of an older revision)")
    ap.add_argument("--child")
    args = ap.parse_args()
    snapshot_ns = int(args.snapshot_ms * 1e6)
    if args.child:
        child(args.child.partition("@")[0], args.seconds, args.rate, snapshot_ns, args.rows)
        return 0
    modes = MODES + (("stats@other", "dashboard@other") if args.other_tree else ())
    out: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(args.repeat):
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        for mode in order:
            env = dict(os.environ)
            if mode.endswith("@other"):
                env["AGENT_REPLAY_BENCH_TREE"] = str(args.other_tree)
            with open(os.devnull, "w") as null:
                proc = subprocess.run([sys.executable, __file__, "--child", mode, "--seconds",
                                       str(args.seconds), "--rate", str(args.rate),
                                       "--snapshot-ms", str(args.snapshot_ms),
                                       "--rows", args.rows], check=True, env=env,
                                      stdout=null, stderr=subprocess.PIPE, text=True)
            line = [x for x in proc.stderr.splitlines() if x.startswith("RESULT ")][-1]
            out[mode].append(json.loads(line[len("RESULT "):]))
    base = out["none"]
    print(f"{args.rate} requests/s for {args.seconds:g} s, snapshot every {args.snapshot_ms:g} "
          f"ms, chunk columns as {args.rows}, {args.repeat} interleaved rounds")
    print(f"{'mode':16s} {'lag P99 ms (rounds)':>22s} {'median':>7s} {'P99-none':>9s} "
          f"{'P99.9 med':>9s} {'CPU % (rounds)':>17s} {'CPU-none':>9s} {'snap ms med/max':>15s} "
          f"{'render CPU %':>12s}")
    for mode, runs in out.items():
        p99 = [x["p99"] for x in runs]
        dp99 = [p - b["p99"] for p, b in zip(p99, base, strict=True)]
        cpu = [x["cpu"] for x in runs]
        dcpu = [c - b["cpu"] for c, b in zip(cpu, base, strict=True)]
        render = [x["render_cpu"] for x in runs if x["render_cpu"] == x["render_cpu"]]
        print(f"{mode:16s} {_fmt(p99, '.2f'):>22s} {statistics.median(p99):7.2f} "
              f"{statistics.median(dp99):+9.2f} {statistics.median(x['p999'] for x in runs):9.2f} "
              f"{_fmt(cpu, '.1f'):>17s} {statistics.median(dcpu):+9.1f} "
              f"{statistics.median(x['snap_med'] for x in runs):7.2f}/"
              f"{max(x['snap_max'] for x in runs):<7.2f} "
              f"{(f'{statistics.median(render):.1f}' if render else '-'):>12s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
