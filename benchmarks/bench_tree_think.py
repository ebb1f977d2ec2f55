"""Think-time error of tree replays on the simulated engine: trace_0291 (weka, parallel
subagents, speedup 20) and two Claude Code logs with sidechains (speedup 4), token-id
prompts, ``--max-think 8 --rebase-sessions``; prints p50, p99 and max of
sent - (latest dependency's end + think) per trace. Needs ../shared/data.

    .venv/bin/python benchmarks/bench_tree_think.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import agent_replay.engines.sim
from agent_replay.engines.sim.process import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.provenance import code_version
from agent_replay.replay.run import run
from agent_replay.traces.importers import import_paths
from agent_replay.traces.io import write_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AGENT_REPLAY_SHARED", ROOT.parent / "shared")) / "data"
LOGS = (
    "haiku__prefab-cloud__prefab-cloud-python-62",
    "haiku__wemake-services__wemake-python-styleguide-3117",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    profile = json.loads(
        (Path(agent_replay.engines.sim.__file__).parent / "profiles" / "fast.json").read_text()
    )
    profile.update(name="fast-long", max_model_len=262_144)  # trace_0291 reaches 101k tokens
    (tmp / "fast-long.json").write_text(json.dumps(profile))
    traces = {
        "weka": ([SHARED / "weka" / "trace_0291.json"], 20.0),
        "claude": ([SHARED / "claude_code_logs" / x / "trace.jsonl" for x in LOGS], 4.0),
    }
    print(f"# code {code_version()}")
    with SimProcess(tmp / "fast-long.json") as sim:
        for r in range(args.repeat):
            for name, (paths, speedup) in traces.items():
                res = import_paths(paths)
                trace = write_trace(res.table, tmp / f"{name}-{r}.parquet", res.meta)
                dest = tmp / f"{name}-{r}-res"
                run(
                    RunConfig(
                        trace=str(trace),
                        target=sim.url,
                        output=str(dest),
                        salt=0,
                        speedup=speedup,
                        max_think_s=8.0,
                        rebase_sessions=True,
                        api="completions",
                        scrape_interval_s=0,
                        progress=False,
                    ),
                    progress=None,
                )
                d = pq.read_table(dest / "requests").to_pydict()
                err = np.array(
                    [
                        s - p - t
                        for s, p, t in zip(
                            d["sent_ns"], d["parent_end_ns"], d["think_ns"], strict=True
                        )
                        if p is not None and t is not None
                    ],
                    dtype=np.float64,
                )
                print(
                    f"{name:7s} run {r}: n {err.size}  think-time error p50 "
                    f"{np.percentile(err, 50) / 1e6:.3f} ms  p99 {np.percentile(err, 99) / 1e6:.3f} ms"
                    f"  max {err.max() / 1e6:.3f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
