"""Trace-layer benchmarks: Mooncake import, reading a 1M-request trace, ``traces inspect``.

    .venv/bin/python benchmarks/bench_traces.py [--shared ../shared] [--repeat 3]

Every figure is the best of ``--repeat`` runs in a fresh subprocess (so peak RSS is the
child's own) and is printed beside a baseline measured in the same run on the same file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import resource, sys, time
t0 = time.perf_counter_ns()
{body}
dt = time.perf_counter_ns() - t0
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

BODIES = {
    "json_lines": "import json\nrows=[json.loads(l) for l in open(sys.argv[1], 'rb')]",
    "read_trace": "from agent_replay.traces.io import read_trace\nt,m=read_trace(sys.argv[1])",
    "pq_read": "import pyarrow.parquet as pq\nt=pq.read_table(sys.argv[1])",
}


def child(body: str, arg: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(body=body), arg],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.split()
    return int(out[0]) / 1e9, int(out[1]) / 1024  # s, MiB


def cmd(args: list[str]) -> float:
    t0 = time.perf_counter_ns()
    subprocess.run(
        [sys.executable, "-m", "agent_replay", *args], check=True, capture_output=True, cwd=ROOT
    )
    return (time.perf_counter_ns() - t0) / 1e9


def best(f, repeat: int):  # type: ignore[no-untyped-def]
    runs = [f() for _ in range(repeat)]
    return min(runs) if not isinstance(runs[0], tuple) else min(runs, key=lambda r: r[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1_000_000)
    a = ap.parse_args()
    rows: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        mc = Path(a.shared) / "data" / "mooncake" / "conversation_trace.jsonl"
        if mc.exists():
            out = Path(tmp) / "mc.parquet"
            imp = best(
                lambda: cmd(["traces", "import", str(mc), "-o", str(out), "--force"]), a.repeat
            )
            py_start = best(lambda: cmd(["--version"]), a.repeat)
            base, _ = best(lambda: child(BODIES["json_lines"], str(mc)), a.repeat)
            rows.append(
                (
                    "import mooncake 12,031 req (CLI, end to end)",
                    f"{imp:.2f} s",
                    "< 2 s",
                    f"json.loads of lines {base:.3f} s; CLI start {py_start:.2f} s",
                    f"{imp / base:.1f}x",
                )
            )
        else:
            print(f"skipping the Mooncake import: {mc} not found")

        from agent_replay.traces.io import write_trace
        from agent_replay.traces.synth import SynthConfig, SynthModel, synthesize

        big = Path(tmp) / "big.parquet"
        sessions = max(1, a.requests // 8)
        t0 = time.perf_counter()
        table, meta = synthesize(
            SynthModel(turns=SynthModel().turns.__class__(8, 0.0, 8, 8)),
            SynthConfig(sessions=sessions, seed=1, block_size=512),
        )
        write_trace(table, big, meta)
        n = table.num_rows
        del table
        print(
            f"synthesized {n:,} requests in {time.perf_counter() - t0:.1f} s "
            f"({big.stat().st_size / 2**20:.0f} MiB)"
        )
        rd, rss = best(lambda: child(BODIES["read_trace"], str(big)), a.repeat)
        prd, prss = best(lambda: child(BODIES["pq_read"], str(big)), a.repeat)
        rows.append(
            (
                f"read_trace {n:,} req",
                f"{rd:.2f} s",
                "< 2 s",
                f"pq.read_table {prd:.2f} s",
                f"{rd / prd:.2f}x",
            )
        )
        rows.append(
            (
                f"read_trace {n:,} req peak RSS",
                f"{rss:.0f} MiB",
                "< 1024 MiB",
                f"pq.read_table {prss:.0f} MiB",
                f"{rss / prss:.2f}x",
            )
        )
        ins = best(lambda: cmd(["traces", "inspect", str(big)]), a.repeat)
        rows.append(
            (
                f"traces inspect {n:,} req (CLI)",
                f"{ins:.2f} s",
                "< 3 s",
                f"pq.read_table {prd:.2f} s",
                f"{ins / prd:.1f}x",
            )
        )

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench_traces (best of {a.repeat})")
    for c in ("what", "measured", "target", "baseline (same run)", "ratio"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)


if __name__ == "__main__":
    main()
