"""Replay one Claude Code trace against the simulated engine with ``--api completions``
and ``--api chat`` (and optionally ``messages``/``responses``): prefix-cache hit rate
against what the trace implies, and think-time error.

    python benchmarks/bench_api_fidelity.py [--trace PATH] [--speedup 20] [--apis completions chat]

``--trace`` is any trace; by default the Claude Code logs of ../shared/data
(``$AGENT_REPLAY_SHARED/data``) are imported
(``traces import claude-code``). Sessions are moved to start one second apart (their
recorded starts are hours apart) and think times are divided by ``--speedup``. The engine
is ``fast`` with ``max_model_len`` 131072, in its own process, fresh for every API.

Per API: requests ok, server prefix-cache hit rate (cached / prompt tokens, from usage),
the rate the trace implies (an unbounded cache, vLLM's rules: the plan's
``implied_cached_tokens``), prompt-count mismatches, and think-time error
(sent - parent end - think) p50/p99/max in ms. Noisy on shared machines: run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_replay.engines.sim import SimProcess, SimProfile
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import arun
from agent_replay.traces.io import read_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
CLAUDE_LOGS = (
    Path(os.environ.get("AGENT_REPLAY_SHARED", ROOT.parent / "shared"))
    / "data"
    / "claude_code_logs"
)


def _import_default(tmp: Path) -> Path:
    out = tmp / "claude-code.parquet"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "traces",
            "import",
            str(CLAUDE_LOGS),
            "-o",
            str(out),
            "--force",
        ],
        check=True,
        capture_output=True,
    )
    return out


def _compact(src: Path, dst: Path, gap_ns: int = 1_000_000_000) -> Path:
    """Sessions one ``gap_ns`` apart, in their recorded order; everything else as is."""
    table, meta = read_trace(src)
    sid = table.column("session_id").to_pylist()
    arr = table.column("arrival_ns").to_numpy().copy()
    starts: dict[str, int] = {}
    for s, a in zip(sid, arr, strict=True):
        starts[s] = min(starts.get(s, a), a)
    order = {s: i for i, s in enumerate(sorted(starts, key=lambda s: starts[s]))}
    shifted = np.array([a - starts[s] + order[s] * gap_ns for s, a in zip(sid, arr, strict=True)])
    table = table.set_column(
        table.schema.get_field_index("arrival_ns"), "arrival_ns", pa.array(shifted, pa.int64())
    )
    write_trace(table, dst, meta)
    return dst


def _profile(tmp: Path) -> str:
    base = SimProfile.load("fast").to_dict()
    base.update(name="fast-long", max_model_len=131072, eos_prob=0.0)
    path = tmp / "fast-long.json"
    path.write_text(json.dumps(base))
    return str(path)


async def _run(trace: Path, api: str, speedup: float, profile: str, out: Path) -> dict:
    with SimProcess(profile, seed=1) as sim:
        summary = await arun(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(out),
                progress=False,
                scrape_interval_s=0,
                api=api,
                speedup=speedup,
                salt=0,
            ),
            progress=None,
        )
    res = pq.read_table(out / "requests")
    ok = pc.equal(res.column("status"), "ok")
    r = res.filter(ok)
    prompt = pc.sum(r.column("prompt_tokens")).as_py() or 0
    cached = pc.sum(r.column("cached_tokens")).as_py() or 0
    expected = pc.sum(r.column("expected_input_tokens")).as_py() or 0
    implied = pc.sum(r.column("implied_cached_tokens")).as_py() or 0
    mism = int(
        pc.sum(pc.not_equal(r.column("prompt_tokens"), r.column("expected_input_tokens"))).as_py()
        or 0
    )
    rows = r.to_pylist()
    err = np.array(
        [
            x["sent_ns"] - x["parent_end_ns"] - x["think_ns"]
            for x in rows
            if x["parent_index"] >= 0 and x["parent_end_ns"] is not None
        ],
        dtype=float,
    )
    return {
        "api": api,
        "requests": res.num_rows,
        "ok": len(rows),
        "failed": summary.failed,
        "hit_rate": cached / prompt if prompt else 0.0,
        "implied_rate": implied / expected if expected else 0.0,
        "prompt_mismatches": mism,
        "think_err_ms": {
            q: float(np.percentile(err, p)) / 1e6
            for q, p in (("p50", 50), ("p99", 99), ("max", 100))
        }
        if err.size
        else {},
        "abs_think_err_p99_ms": float(np.percentile(np.abs(err), 99)) / 1e6 if err.size else None,
        "within_2ms": f"{int((np.abs(err) <= 2e6).sum())}/{err.size}",
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=None)
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--apis", nargs="+", default=["completions", "chat"])
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        src = Path(a.trace) if a.trace else _import_default(tmp)
        trace = _compact(src, tmp / "compact.parquet")
        profile = _profile(tmp)
        results = []
        for api in a.apis:
            r = await _run(trace, api, a.speedup, profile, tmp / f"res-{api}")
            results.append(r)
            print(
                f"{api:12s} ok {r['ok']}/{r['requests']}  hits {r['hit_rate']:.2%}  "
                f"implied {r['implied_rate']:.2%}  prompt mismatches {r['prompt_mismatches']}  "
                f"think err ms p50 {r['think_err_ms'].get('p50', 0):.3f} "
                f"p99 {r['think_err_ms'].get('p99', 0):.3f} max {r['think_err_ms'].get('max', 0):.3f} "
                f"|p99| {r['abs_think_err_p99_ms']:.3f}  within 2 ms {r['within_2ms']}",
                flush=True,
            )
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
