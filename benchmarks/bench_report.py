"""Benchmark: ``agent-replay report`` over a large results folder.

Target: 1,000,000 result rows in < 5 s and < 2 GiB peak RSS. Each measurement runs in a fresh
subprocess (wall time, CPU time of all its threads, peak RSS); the baseline is a plain pyarrow
read of the same columns of the same files in the same run. Cases are interleaved round by
round, so a busy machine slows them alike; the table shows the best and the median round.

The synthetic data (analysis.fixtures.synthetic_batches) has ~83 chunks per request (median
100 output tokens, lognormal, ~2 tokens per chunk), 0.2% failures, 0.1% warmup rows.
Layouts:

  big      131,072-row part files, pyarrow's default Parquet options (snappy)
  replay   2,000-row part files, zstd: what ``agent-replay run`` writes (replay/results.py)
  delta    2,000-row part files, analysis.results.parquet_write_options() (zstd, chunk times
           DELTA_BINARY_PACKED)

``--other-tree DIR`` also runs the report with DIR first on sys.path (e.g. a ``git worktree``
of an older revision), as a before/after measured in the same run.

    .venv/bin/python benchmarks/bench_report.py [--rows 1000000] [--layout big|replay|delta]
        [--data DIR] [--repeat 3] [--other-tree DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = (
    "import sys, pyarrow.parquet as pq\n"
    "from agent_replay.analysis.runstats import COLUMNS\n"
    "t = pq.read_table(sys.argv[1] + '/requests', columns=list(COLUMNS))\n"
    "print(t.num_rows)\n"
)
REPORT = (
    "import sys\n"
    "from agent_replay.replay.cli import main\n"
    "import io, contextlib\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    rc = main(['report', sys.argv[1], '--format', 'json', '--slo', 'ttft=1s,tpot=30ms',"
    " '--gpus', '8', '--price-input-miss', '0.27', '--price-input-hit', '0.07',"
    " '--price-output', '1.1'])\n"
    "assert rc == 0, rc\n"
)
USAGE = (
    "\nimport resource, sys\n"
    "r = resource.getrusage(resource.RUSAGE_SELF)\n"
    "print('usage', r.ru_maxrss, r.ru_utime + r.ru_stime, file=sys.stderr)\n"
)


def run_case(code: str, data: Path, tree: str | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one fresh interpreter running ``code``; the child
    reports its own peak RSS (ru_maxrss, KiB on Linux) and CPU time (user + system)."""
    if tree:  # ahead of the current directory and the installed project
        code = f"import sys\nsys.path.insert(0, {str(Path(tree).resolve())!r})\n" + code
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code + USAGE, str(data)], check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    usage = [line.split() for line in proc.stderr.splitlines() if line.startswith("usage ")][-1]
    return wall, float(usage[2]), int(usage[1]) / 1024


def generate(data: Path, rows: int, layout: str) -> None:
    from agent_replay.analysis.fixtures import synthetic_batches, write_results
    from agent_replay.analysis.results import parquet_write_options

    opts: dict[str, object] = {}
    part_rows = None
    if layout == "replay":
        opts, part_rows = {"compression": "zstd"}, 2000
    elif layout == "delta":
        opts, part_rows = parquet_write_options(), 2000
    t0 = time.perf_counter()
    write_results(
        data,
        synthetic_batches(
            rows, seed=1, batch_rows=131_072, failed_fraction=0.002, warmup_fraction=0.001
        ),
        part_rows=part_rows,
        **opts,
    )
    print(
        f"generated {rows:,} rows ({layout}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--layout", choices=("big", "replay", "delta"), default="big")
    ap.add_argument("--data", help="reuse/keep the generated results folder here")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--other-tree",
        help="also run the report with this source tree first on "
        "sys.path (before/after in one run)",
    )
    args = ap.parse_args()

    tmp = None
    if args.data:
        data = Path(args.data)
    else:
        tmp = tempfile.TemporaryDirectory()
        data = Path(tmp.name) / "results"
    if not (data / "requests").is_dir():
        generate(data, args.rows, args.layout)
    import pyarrow.parquet as pq

    files = sorted((data / "requests").glob("part-*.parquet"))
    n_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    sample = files[:: max(1, len(files) // 20)]
    metas = [pq.ParquetFile(f).metadata for f in sample]
    per_row = sum(
        g.column(i).num_values
        for m in metas
        for g in map(m.row_group, range(m.num_row_groups))
        for i in range(g.num_columns)
        if g.column(i).path_in_schema.startswith("chunk_ns.")
    ) / max(1, sum(m.num_rows for m in metas))
    size = sum(f.stat().st_size for f in files)
    print(
        f"data: {n_rows:,} rows in {len(files)} part files, {size / 2**20:,.0f} MiB Parquet, "
        f"~{per_row:.0f} chunks per request"
    )
    cases: dict[str, tuple[str, str | None]] = {
        "pyarrow read (baseline)": (BASELINE, None),
        "report --format json": (REPORT, None),
    }
    if args.other_tree:
        cases["report, other tree"] = (REPORT, args.other_tree)
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, (code, tree) in cases.items():
            results[name].append(run_case(code, data, tree))
    base = min(w for w, _, _ in results["pyarrow read (baseline)"])
    base_cpu = min(c for _, c, _ in results["pyarrow read (baseline)"])
    print(f"{args.repeat} interleaved rounds; wall and CPU (user+sys, all threads) in seconds")
    print(
        f"{'case':26s} {'wall best':>9s} {'median':>7s} {'x base':>7s} {'CPU best':>9s} "
        f"{'median':>7s} {'x base':>7s} {'peak RSS MiB':>13s}"
    )
    for name, runs in results.items():
        walls = [w for w, _, _ in runs]
        cpus = [c for _, c, _ in runs]
        print(
            f"{name:26s} {min(walls):9.2f} {statistics.median(walls):7.2f} "
            f"{min(walls) / base:7.2f} {min(cpus):9.2f} {statistics.median(cpus):7.2f} "
            f"{min(cpus) / base_cpu:7.2f} {max(r for _, _, r in runs):13.0f}"
        )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
