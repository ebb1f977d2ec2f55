"""Benchmark: what the live dashboard costs the measuring loop.

A simulated measuring loop (asyncio) fires a timer at scheduled times, 1,000 per second; each
firing records its schedule lag and hands one finished request (a ``RequestRecord`` with ~80
chunks, from synthetic rows) to a ``ResultWriter``, which writes part files on its thread,
as a replay worker does. Modes, each in a fresh subprocess:

  none       that alone (a run without the dashboard)
  dashboard  + what a run with the dashboard adds to the measuring process: the loop-lag
             samples and progress counters encoded and offered to a DashboardProcess every
             250 ms (replay.feed's progress path), and the DashboardProcess itself, which
             reads the part files as they appear, computes the request statistics and
             renders full rich frames (forced terminal, into /dev/null) in its own process

The machine is shared and noisy, so modes are interleaved round by round (in a rotating
order) and every mode is compared with the 'none' run of its own round. Reported per mode:
schedule-lag P99 of each round, the median over rounds of P99 and of P99 minus 'none' in the
same round, measuring-process CPU (process time / wall) and its excess over 'none', the
median and longest snapshot (encode + update) on the loop, and the renderer's own CPU while
measuring (% of one core). Targets: the dashboard raises schedule-lag P99 by <= 1 ms and
costs < 5% of a worker's CPU.

    .venv/bin/python benchmarks/bench_dashboard.py [--seconds 8] [--repeat 3]
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

MODES = ("none", "dashboard")
SNAPSHOT_NS = 250_000_000


def _records() -> list[Any]:
    from agent_replay.analysis.fixtures import synthetic_results
    from agent_replay.replay.outcome import RequestRecord

    out = []
    for i, row in enumerate(synthetic_results(512, seed=3).to_pylist()):
        r = RequestRecord(
            session_id=row["session_id"],
            request_index=row["request_index"],
            parent_index=row["parent_index"],
            clone=0,
            worker=0,
            request_id=f"r{i}",
            api=row["api"],
            expected_input_tokens=row["expected_input_tokens"],
            expected_output_tokens=row["expected_output_tokens"],
            implied_cached_tokens=row["implied_cached_tokens"],
        )
        for name in (
            "intended_ns",
            "sent_ns",
            "first_token_ns",
            "end_ns",
            "status",
            "error_kind",
            "completion_tokens",
            "prompt_tokens",
        ):
            setattr(r, name, row[name])
        r.chunk_ns = array("q", row["chunk_ns"] or ())
        r.chunk_tokens = array("i", row["chunk_tokens"] or ())
        out.append(r)
    return out


async def _loop(mode: str, seconds: float, rate: int, folder: str) -> dict[str, float]:
    from pathlib import Path

    from agent_replay.analysis.dashboard import DashboardProcess
    from agent_replay.analysis.live import LiveStats
    from agent_replay.replay.results import ResultWriter

    records = _records()
    writer = ResultWriter(Path(folder), t0_ns=0)
    own = LiveStats() if mode == "dashboard" else None
    dash = None
    n = int(seconds * rate)
    if mode == "dashboard":
        dash = DashboardProcess(total_requests=n, title="bench", tty=True, results_dir=folder)
        dash.start()
        await asyncio.sleep(1.5)  # let the child start (imports) before measuring
    render0 = _cpu_of(dash)
    interval = 1_000_000_000 // rate
    lags = []
    snaps = [0]
    start = time.perf_counter_ns()
    cpu0 = time.process_time_ns()
    next_snap = start + SNAPSHOT_NS
    seen = 0
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
        writer.add(records[i % len(records)])
        if now >= next_snap:
            next_snap += SNAPSHOT_NS
            writer.tick(now)
            if own is not None and dash is not None:
                own.observe_loop_lags(lags[seen:])
                seen = len(lags)
                own.done, own.total, own.elapsed_ns = i, n, now - start
                dash.update(own.encode())
                snaps.append(time.perf_counter_ns() - now)
    wall = time.perf_counter_ns() - start
    cpu = time.process_time_ns() - cpu0
    render_cpu = (_cpu_of(dash) - render0) / wall * 100 if dash is not None else float("nan")
    writer.close()
    if dash is not None:
        dash.stop()
    a = np.asarray(lags, dtype=np.float64)
    return {
        "cpu": cpu / wall * 100,
        "p50": float(np.percentile(a, 50)) / 1e6,
        "p99": float(np.percentile(a, 99)) / 1e6,
        "p999": float(np.percentile(a, 99.9)) / 1e6,
        "snap_med": float(np.median(snaps[1:] or [0])) / 1e6,
        "snap_max": max(snaps) / 1e6,
        "render_cpu": render_cpu,
    }


def _cpu_of(dash: Any) -> int:
    """CPU time (ns) the dashboard's renderer process has used so far."""
    if dash is None:
        return 0
    import psutil

    t = psutil.Process(dash._proc.pid).cpu_times()
    return int((t.user + t.system) * 1e9)


def child(mode: str, seconds: float, rate: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        res = asyncio.run(_loop(mode, seconds, rate, folder))
    print("RESULT " + json.dumps(res), file=sys.stderr, flush=True)


def _fmt(xs: list[float], spec: str) -> str:
    return ", ".join(format(x, spec) for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seconds, args.rate)
        return 0
    out: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.repeat):
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        for mode in order:
            with open(os.devnull, "w") as null:
                proc = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        mode,
                        "--seconds",
                        str(args.seconds),
                        "--rate",
                        str(args.rate),
                    ],
                    check=True,
                    stdout=null,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            line = [x for x in proc.stderr.splitlines() if x.startswith("RESULT ")][-1]
            out[mode].append(json.loads(line[len("RESULT ") :]))
    base = out["none"]
    print(
        f"{args.rate} requests/s for {args.seconds:g} s, snapshot every {SNAPSHOT_NS / 1e6:g} ms, "
        f"{args.repeat} interleaved rounds"
    )
    print(
        f"{'mode':16s} {'lag P99 ms (rounds)':>22s} {'median':>7s} {'P99-none':>9s} "
        f"{'P99.9 med':>9s} {'CPU % (rounds)':>17s} {'CPU-none':>9s} {'snap ms med/max':>15s} "
        f"{'render CPU %':>12s}"
    )
    for mode, runs in out.items():
        p99 = [x["p99"] for x in runs]
        dp99 = [p - b["p99"] for p, b in zip(p99, base, strict=True)]
        cpu = [x["cpu"] for x in runs]
        dcpu = [c - b["cpu"] for c, b in zip(cpu, base, strict=True)]
        render = [x["render_cpu"] for x in runs if x["render_cpu"] == x["render_cpu"]]
        print(
            f"{mode:16s} {_fmt(p99, '.2f'):>22s} {statistics.median(p99):7.2f} "
            f"{statistics.median(dp99):+9.2f} {statistics.median(x['p999'] for x in runs):9.2f} "
            f"{_fmt(cpu, '.1f'):>17s} {statistics.median(dcpu):+9.1f} "
            f"{statistics.median(x['snap_med'] for x in runs):7.2f}/"
            f"{max(x['snap_max'] for x in runs):<7.2f} "
            f"{(f'{statistics.median(render):.1f}' if render else '-'):>12s}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
