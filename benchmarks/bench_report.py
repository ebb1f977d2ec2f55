"""Benchmark: ``agent-replay report`` over a large results folder.

Target: 1,000,000 result rows in < 5 s and < 2 GiB peak RSS. Each measurement runs in a fresh
subprocess (wall time and peak RSS of that process); the baseline is a plain pyarrow read of
the same columns of the same files in the same run.

    .venv/bin/python benchmarks/bench_report.py [--rows 1000000] [--data DIR] [--repeat 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "pyarrow read (baseline)": (
        "import sys, pyarrow.parquet as pq\n"
        "from analysis.runstats import COLUMNS\n"
        "t = pq.read_table(sys.argv[1] + '/requests', columns=list(COLUMNS))\n"
        "print(t.num_rows)\n"),
    "report --format json": (
        "import sys\n"
        "from replay.cli import main\n"
        "import io, contextlib\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['report', sys.argv[1], '--format', 'json', '--slo', 'ttft=1s,tpot=30ms',"
        " '--gpus', '8', '--price-input-miss', '0.27', '--price-input-hit', '0.07',"
        " '--price-output', '1.1'])\n"
        "sys.exit(rc)\n"),
}


RSS = ("\nimport resource, sys\n"
       "print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")


def run_case(code: str, data: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh interpreter running ``code``; the child
    reports its own peak RSS (ru_maxrss, KiB on Linux)."""
    body = code.replace("sys.exit(rc)\n", "") + RSS
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", body, str(data)], check=True,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("maxrss")]
    return wall, rss[-1] / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--data", help="reuse/keep the generated results folder here")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from analysis.fixtures import synthetic_batches, write_results

    tmp = None
    if args.data:
        data = Path(args.data)
    else:
        tmp = tempfile.TemporaryDirectory()
        data = Path(tmp.name) / "results"
    if not (data / "requests").is_dir():
        t0 = time.perf_counter()
        write_results(data, synthetic_batches(args.rows, seed=1, batch_rows=131_072,
                                              failed_fraction=0.002, warmup_fraction=0.001))
        print(f"generated {args.rows:,} rows in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    import pyarrow.parquet as pq

    meta = pq.ParquetDataset(str(data / "requests")).files
    chunks = sum(pq.ParquetFile(f).metadata.num_rows for f in meta)
    size = sum(Path(f).stat().st_size for f in meta)
    print(f"data: {chunks:,} rows, {size / 2**20:,.0f} MiB Parquet")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    for _ in range(args.repeat):
        for name, code in CASES.items():
            results[name].append(run_case(code, data))
    base = min(w for w, _ in results["pyarrow read (baseline)"])
    print(f"{'case':28s} {'wall s (best)':>14s} {'wall s (all)':>22s} {'x baseline':>11s} "
          f"{'peak RSS MiB':>13s}")
    for name, runs in results.items():
        best = min(w for w, _ in runs)
        print(f"{name:28s} {best:14.2f} {', '.join(f'{w:.2f}' for w, _ in runs):>22s} "
              f"{best / base:11.2f} {max(r for _, r in runs):13.0f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
