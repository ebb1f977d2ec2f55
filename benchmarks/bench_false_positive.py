"""Benchmark: how often do ``compare`` and ``sweep`` call a difference between identical runs?

Pairs of identical runs (the same simulated-engine profile, the same trace, the same load
and prompts; two targets that differ only in name, interleaved by the sweep) on a quiet host,
then again with a CPU burner on every core (started and stopped by this script). Every
verdict either tool gives about them is a false positive. Target: at most 5% of the
statistics tested flagged, in both phases, for

  compare 1v1   ``compare A B`` on each pair (time-block bootstrap, Holm over its table;
                no verdict where a run's self-check found host contention: counted apart)
  compare 3v3   ``compare A1,A2,A3 B1,B2,B3`` on consecutive pairs (paired t on log ratios)
  sweep         the frontier's paired comparisons of 3-repeat sweeps made of consecutive
                pairs (``analysis.frontier.comparisons``: one family per sweep)

    PYTHONPATH=$PWD python benchmarks/bench_false_positive.py --pairs 20
    PYTHONPATH=$PWD python benchmarks/bench_false_positive.py --pairs 3 --phases busy   # smoke

Writes its figures as JSON (``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "samples" / "agent-small.parquet"

EXPERIMENT = """
trace = "{trace}"
output = "{out}"
repeats = {pairs}
seed = {seed}
[load]
axis = "concurrent_sessions"
points = [{sessions}]
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
name = "a"
sim = "{profile}"
[[targets]]
name = "b"
sim = "{profile}"
"""


@contextmanager
def cpu_burner(n: int) -> Iterator[list[int]]:
    """``n`` processes spinning on a core each; stopped (by their pids) on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_pairs(out: Path, args: argparse.Namespace, seed: int) -> Path:
    from agent_replay.replay.sweep import load_experiment, run_sweep

    out.mkdir(parents=True, exist_ok=True)
    exp_file = out / "exp.toml"
    exp_file.write_text(
        EXPERIMENT.format(
            trace=TRACE,
            out=out / "sweep",
            pairs=args.pairs,
            seed=seed,
            sessions=args.sessions,
            speedup=args.speedup,
            duration=args.duration,
            warmup="true" if args.warmup else "false",
            profile=args.profile,
        )
    )
    res = run_sweep(
        load_experiment(exp_file),
        force=True,
        progress=(lambda line: print("  " + line, file=sys.stderr)) if args.verbose else None,
    )
    return res.out


def count(sweep: Path) -> dict[str, Any]:
    """The false-positive counts of one phase's pairs."""
    from agent_replay.analysis.compare import (
        _arrays,
        compare_arms,
        compare_arrays,
        compare_dirs,
        with_holm,
    )
    from agent_replay.analysis.frontier import comparisons, points, read_sweep
    from agent_replay.analysis.report import build_report

    _, rows = read_sweep(sweep)
    done = {(r["target"], int(r["repeat"])): r for r in rows if r["status"] == "complete"}
    reps = sorted(r for t, r in done if t == "a" and ("b", r) in done)
    out: dict[str, Any] = {
        "pairs": len(reps),
        "failed_runs": sum(1 for r in rows if r["status"] != "complete"),
    }
    tested = flagged = refused = 0
    would_test = would_flag = 0  # the refused pairs' verdicts, had they been given
    for r in reps:
        dirs = [sweep / done[(t, r)]["path"] for t in ("a", "b")]
        c = compare_dirs(dirs)
        ds = c.deltas[0]
        if any("host contention" in (d.note or "") for d in ds):
            refused += 1
            reports = [build_report(d) for d in dirs]
            arrays = [_arrays(rep) for rep in reports]
            (raw,) = with_holm(
                [
                    compare_arrays(
                        arrays[0],
                        arrays[1],
                        order=(arrays[0]["intended_ns"], arrays[1]["intended_ns"]),
                    )
                ]
            )
            would_test += sum(1 for d in raw if d.ci_low is not None)
            would_flag += sum(d.significant for d in raw)
            continue
        with_ci = [d for d in ds if d.ci_low is not None]
        tested += len(with_ci)
        flagged += sum(d.significant for d in with_ci)
    out["compare_1v1"] = {
        "tested": tested,
        "flagged": flagged,
        "refused_pairs": refused,
        "refused_would_flag": would_flag,
        "refused_would_test": would_test,
    }
    tested = flagged = 0
    groups = [reps[i : i + 3] for i in range(0, len(reps) - 2, 3)]
    for g in groups:
        arms = [[sweep / done[(t, r)]["path"] for r in g] for t in ("a", "b")]
        c = compare_arms(arms, ["a", "b"])
        lines = [v for v in c.verdicts if not v.startswith("Verdicts are Holm")]
        tested += sum(1 for v in lines if "95% CI" in v)
        flagged += sum(1 for v in lines if v.endswith(": better") or v.endswith(": worse"))
    out["compare_3v3"] = {"tested": tested, "flagged": flagged, "groups": len(groups)}
    tested = flagged = 0
    for g in groups:
        sub = [r for r in rows if int(r["repeat"]) in g]
        lines = comparisons(points(sub), order=("a", "b"))[:-1]
        tested += sum(1 for v in lines if "95% CI" in v)
        flagged += sum(1 for v in lines if v.endswith(": better") or v.endswith(": worse"))
    out["sweep"] = {"tested": tested, "flagged": flagged, "sweeps": len(groups)}
    out["contention_runs"] = sum(1 for r in rows if r.get("machine_contention"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--pairs", type=int, default=20, help="pairs of identical runs per phase (default 20)"
    )
    ap.add_argument("--phases", default="quiet,busy", help="quiet, busy or both (default)")
    ap.add_argument(
        "--sessions", type=int, default=8, help="concurrent sessions per run (default 8)"
    )
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per run (default 8)")
    ap.add_argument(
        "--profile", default="default", help="simulated-engine profile (default 'default')"
    )
    ap.add_argument(
        "--burners",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU burner processes in the busy phase (default: one per core)",
    )
    ap.add_argument("--warmup", action="store_true", help="warm-up bursts before each run")
    ap.add_argument("--keep", default=None, help="keep the runs in this folder")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    results: dict[str, Any] = {
        "args": vars(args),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-fp-"))
    for i, phase in enumerate(phases):
        t0 = time.monotonic()
        if phase == "busy":
            with cpu_burner(args.burners):
                sweep = run_pairs(base / phase, args, seed=100 + i)
        else:
            sweep = run_pairs(base / phase, args, seed=100 + i)
        results[phase] = count(sweep) | {
            "wall_s": round(time.monotonic() - t0, 1),
            "load_after": os.getloadavg(),
        }
    print(f"{'phase':6} {'tool':12} {'flagged':>8} {'tested':>7} {'rate':>6}  notes")
    ok = True
    for phase in phases:
        r = results[phase]
        for tool in ("compare_1v1", "compare_3v3", "sweep"):
            c = r[tool]
            rate = c["flagged"] / c["tested"] if c["tested"] else 0.0
            ok &= rate <= 0.05
            note = (
                f"{c['refused_pairs']} pairs refused (host contention); had they been "
                f"judged: {c['refused_would_flag']} of {c['refused_would_test']} flagged"
                if "refused_pairs" in c
                else ""
            )
            print(f"{phase:6} {tool:12} {c['flagged']:>8} {c['tested']:>7} {rate:>6.1%}  {note}")
        print(
            f"{phase:6} {r['pairs']} pairs, {r['failed_runs']} runs not complete, "
            f"{r['contention_runs']} runs with host contention, {r['wall_s']} s"
        )
    print("target (at most 5% flagged everywhere): " + ("met" if ok else "NOT met"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
