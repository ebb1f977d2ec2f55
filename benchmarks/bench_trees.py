"""CPU cost of agent trees against chains: planning and replaying at max rate.

    python benchmarks/bench_trees.py [--requests 100000] [--concurrency 64] [--out DIR]

Two synthetic traces of the same size, tokens and sessions: chains (10 turns, each on the
previous) and trees (per session: main turn 0 spawns two parallel subagents of 3 turns
each, main turn 7 joins both, then turns 8 and 9; 10 requests). Both are replayed one
after the other, in one process, against one simulated engine (``fast`` profile, 32-token
prompts, 2 output tokens) at ``--timing max-rate``. Reported per trace: planning CPU
(``build_plan``, this process) and replay CPU (the worker's run phase), in microseconds per
request, and the tree / chain ratio (target: at most 1.10). Figures are noisy on shared
machines: compare the two rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_replay.engines.sim import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.plan import PlanOptions, build_plan
from agent_replay.replay.run import run
from agent_replay.traces.io import read_trace, write_trace
from agent_replay.traces.schema import TraceMeta

PER_SESSION = 10
TREE = [  # (agent, depends_on) of one session's requests, in arrival order
    ("main", []),
    ("x", [0]),
    ("y", [0]),
    ("x", [1]),
    ("y", [2]),
    ("x", [3]),
    ("y", [4]),
    ("main", [0, 5, 6]),
    ("main", [7]),
    ("main", [8]),
]
TREE_PARENT = [-1, -1, -1, 1, 2, 3, 4, 0, 7, 8]  # prefix parents: each stream extends itself


def make_trace(path: Path, n: int, tree: bool) -> Path:
    sessions = n // PER_SESSION
    sid, idx, parent, arrival, agent, deps = [], [], [], [], [], []
    for s in range(sessions):
        for i in range(PER_SESSION):
            sid.append(f"s{s}")
            idx.append(i)
            arrival.append(s * 1_000_000 + i * 100_000_000)
            if tree:
                a, d = TREE[i]
                agent.append(a)
                deps.append(d)
                parent.append(TREE_PARENT[i])
            else:
                agent.append("main")
                deps.append([i - 1] if i else [])
                parent.append(i - 1)
    m = len(sid)
    table = pa.table(
        {
            "session_id": sid,
            "request_index": pa.array(idx, pa.int32()),
            "parent_index": pa.array(parent, pa.int32()),
            "arrival_ns": pa.array(arrival, pa.int64()),
            "input_tokens": pa.array([32] * m, pa.int32()),
            "output_tokens": pa.array([2] * m, pa.int32()),
            "hash_ids": pa.array([[k * 2, k * 2 + 1] for k in range(m)], pa.list_(pa.int64())),
            "agent_id": pa.array(agent, pa.string()),
            "depends_on": pa.array(deps, pa.list_(pa.int32())),
        }
    )
    return write_trace(table, path, TraceMeta(block_size=16), force=True)


def measure(trace: Path, sim_url: str, out: Path, concurrency: int) -> dict[str, float]:
    table, meta = read_trace(trace)
    c0 = time.process_time()
    plan = build_plan(table, meta.block_size, PlanOptions())
    plan_s = time.process_time() - c0
    n = plan.n_requests
    s = run(
        RunConfig(
            trace=str(trace),
            target=sim_url,
            output=str(out),
            force=True,
            salt=0,
            timing="max-rate",
            concurrency=concurrency,
            scrape_interval_s=0,
            progress=False,
        ),
        progress=None,
    )
    cpu = sum(w.cpu_run_s for w in s.workers)
    return {
        "requests": n,
        "ok": s.ok,
        "plan_us_per_request": plan_s / n * 1e6,
        "replay_us_per_request": cpu / n * 1e6,
        "wall_s": s.wall_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    a = ap.parse_args()
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, SimProcess("fast") as sim:
        d = Path(tmp)
        for name, tree in (("chain", False), ("tree", True)):
            trace = make_trace(d / f"{name}.parquet", a.requests, tree)
            rows[name] = measure(trace, sim.url, d / f"{name}-res", a.concurrency)
            print(name, json.dumps(rows[name]), flush=True)
    ratio = {
        k: rows["tree"][k] / rows["chain"][k]
        for k in ("plan_us_per_request", "replay_us_per_request")
    }
    total = (rows["tree"]["plan_us_per_request"] + rows["tree"]["replay_us_per_request"]) / (
        rows["chain"]["plan_us_per_request"] + rows["chain"]["replay_us_per_request"]
    )
    print(f"{'':8}{'requests':>10}{'plan us/req':>14}{'replay us/req':>15}{'wall s':>9}")
    for name, r in rows.items():
        print(
            f"{name:8}{int(r['requests']):>10}{r['plan_us_per_request']:>14.1f}"
            f"{r['replay_us_per_request']:>15.1f}{r['wall_s']:>9.1f}"
        )
    print(
        f"tree / chain: plan {ratio['plan_us_per_request']:.3f}, replay "
        f"{ratio['replay_us_per_request']:.3f}, total {total:.3f} (target <= 1.10)"
    )
    if a.out:
        a.out.write_text(json.dumps({"rows": rows, "ratio": ratio, "total_ratio": total}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
