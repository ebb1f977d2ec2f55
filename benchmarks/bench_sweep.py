"""Benchmark: how much of a sweep's wall time is spent outside its runs.

Target: a sweep of 12 short runs on the simulated engine (2 profiles x 2 load points x 3
repeats) spends under 5% of its wall time outside the runs: starting the servers, the
warm-up decisions (reading each burst's results), building each run's figures, writing the
index. Warm-up traffic is load on the server, counted apart. The figures:

  wall          the whole ``run_sweep`` call
  runs          the ``replay.run.run`` calls of the measured runs (each includes its own
                set-up: plan, probe, results folder, run.json)
  replay        the replays themselves, first send to last byte (the workers' wall time)
  warm-up       the warm-up bursts, their replays and their steadiness decisions
  outside       wall - runs - warm-up: server start, indexing, the schedule, the frontier
                is not included (built afterwards)

    .venv/bin/python benchmarks/bench_sweep.py [--duration 3] [--speedup 8] [--turns 5] [--no-warmup]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

EXPERIMENT = """
trace = "{trace}"
output = "{out}"
repeats = 3
seed = 1
[load]
axis = "concurrent_sessions"
points = [2, 6]
[run]
speedup = {speedup}
duration_s = {duration}
scrape_interval_s = 0
[warmup]
enabled = {warmup}
burst_s = 1.0
min_bursts = 2
max_bursts = 3
tolerance = 0.2
[[targets]]
name = "default"
sim = "default"
[[targets]]
name = "mtp"
sim = "mtp"
"""


def trace(path: Path, sessions: int = 6, turns: int = 5) -> Path:
    """Agent-like sessions: chained turns whose prompts grow, 1 s of tool time between."""
    cols: dict[str, list[object]] = {
        k: []
        for k in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
            "api",
        )
    }
    for s in range(sessions):
        n_in, t = 1200 + 100 * s, s * 500_000_000
        for r in range(turns):
            cols["session_id"].append(f"s{s}")
            cols["request_index"].append(r)
            cols["parent_index"].append(r - 1)
            cols["arrival_ns"].append(t)
            cols["think_ns"].append(1_000_000_000 if r else None)
            cols["input_tokens"].append(n_in)
            cols["output_tokens"].append(60 + 10 * r)
            cols["hash_ids"].append([s * 1000 + i for i in range(-(-n_in // 16))])
            cols["api"].append("completions")
            t += 2_000_000_000
            n_in += 200
    return write_trace(pa.table(cols), path, TraceMeta(block_size=16), force=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--speedup", type=float, default=8.0)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--turns", type=int, default=5, help="turns per session (run length)")
    args = ap.parse_args()
    import signal

    from agent_replay.replay.sweep import load_experiment, run_sweep

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the sweep stops the servers it started

    signal.signal(signal.SIGTERM, stop)

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        tr = trace(root / "t.parquet", turns=args.turns)
        exp_file = root / "exp.toml"
        exp_file.write_text(
            EXPERIMENT.format(
                trace=tr,
                out=root / "sweep",
                speedup=args.speedup,
                duration=args.duration,
                warmup="false" if args.no_warmup else "true",
            )
        )
        t0 = time.monotonic()
        res = run_sweep(load_experiment(exp_file))
        wall = time.monotonic() - t0
        t = res.timing
        runs = t.get("run_s", 0.0)
        warm = t.get("warmup_s", 0.0)
        replay = t.get("replay_s", 0.0)
        outside = wall - runs - warm
        out = {
            "runs": len(res.rows),
            "complete": sum(r["status"] == "complete" for r in res.rows),
            "wall_s": round(wall, 2),
            "runs_s": round(runs, 2),
            "replay_s": round(replay, 2),
            "warmup_s": round(warm, 2),
            "server_start_s": round(t.get("server_start_s", 0.0), 2),
            "outside_s": round(outside, 2),
            "outside_fraction": round(outside / wall, 4),
            "outside_replays_fraction": round((wall - replay - warm) / wall, 4),
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
