"""``agent-replay demo``: the whole loop on a laptop. Starts the simulated engine, replays the
bundled sample trace against it, writes a fresh results folder and returns the summary."""

from __future__ import annotations

import datetime as _dt
import tempfile
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from agent_replay.replay.config import DEMO_SPEEDUP, RunConfig
from agent_replay.replay.feed import Reporter
from agent_replay.replay.run import _stderr, run
from agent_replay.replay.runrecord import RunSummary
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

DEFAULT_SPEEDUP = DEMO_SPEEDUP


def sample_trace() -> Path | None:
    import agent_replay.traces

    p = Path(agent_replay.traces.__file__).resolve().parent / "samples" / "agent-small.parquet"
    return p if p.exists() else None


def synthetic_trace(path: Path, sessions: int = 8, turns: int = 6) -> Path:
    """A small agent-like trace made in code: chained turns whose prompts grow by the
    previous answer and a tool result, 2-8 s of tool time between turns."""
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
    bs = 16
    for s in range(sessions):
        t = s * 3_000_000_000
        n_in = 800 + 97 * s
        for r in range(turns):
            out = 40 + (s * 31 + r * 17) % 120
            think = 2_000_000_000 + ((s * 7 + r * 13) % 7) * 1_000_000_000 if r else None
            cols["session_id"].append(f"demo-{s}")
            cols["request_index"].append(r)
            cols["parent_index"].append(r - 1)
            cols["arrival_ns"].append(t)
            cols["think_ns"].append(think)
            cols["input_tokens"].append(n_in)
            cols["output_tokens"].append(out)
            cols["hash_ids"].append([s * 10_000 + i for i in range(-(-n_in // bs))])
            cols["api"].append("completions")
            t += 1_000_000_000 + (think or 0)
            n_in += out + 150
    table = pa.table(cols)
    meta = TraceMeta(
        block_size=bs, source="synthetic", extra={"description": "demo trace made in code"}
    )
    return write_trace(table, path, meta, force=True)


def demo(
    *,
    output: str | None = None,
    profile: str | None = None,
    speedup: float | None = None,
    trace: str | None = None,
    progress: Reporter | None = _stderr,
) -> RunSummary:
    from agent_replay.engines.sim import SimProcess

    out = output or str(Path("demo-results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    with tempfile.TemporaryDirectory(prefix="agent-replay-demo-") as tmp:
        path = Path(trace) if trace else sample_trace()
        if path is None:
            path = synthetic_trace(Path(tmp) / "demo.parquet")
        cfg = RunConfig(
            trace=str(path),
            target="http://127.0.0.1",
            output=out,
            speedup=DEFAULT_SPEEDUP if speedup is None else speedup,
            salt=0,
        )
        cfg.check()  # a bad option is refused before the engine starts
        if progress is not None:
            progress(
                f"starting the simulated engine (profile {profile or 'default'}; a model, "
                "not a measurement of a real engine)"
            )
        with SimProcess(profile or "default") as sim:
            return run(replace(cfg, target=sim.url), progress=progress)
