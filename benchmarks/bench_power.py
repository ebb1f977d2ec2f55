"""Benchmark: how often does ``compare`` find a real difference, and with the right sign?

Simulated-engine profiles made 5%, 10% and 25% slower at decode (every decode-step term of
the ``default`` profile scaled), and an identical copy, each replayed against the baseline in
one sweep (targets interleaved per repeat), on a quiet host and then beside a CPU burner on
every core (busy). Each difference is judged four ways:

  1v1 unpaired   ``compare A B`` without pairing: each run's time-block bootstrap (no verdict
                 where a run's self-check found host contention)
  1v1 paired     ``compare A B``: requests paired by identity, cluster bootstrap over sessions
  3v3 unpaired   ``compare A1,A2,A3 B1,B2,B3`` with run-level paired t intervals only
  3v3 paired     ``compare A1,A2,A3 B1,B2,B3``: requests paired within each run pair
  1v1 interleaved  ``run --targets A,B``: both lanes of one plan at once, paired
  3v3 interleaved  three such invocations, compared as ``compare A1,A2,A3 B1,B2,B3``

for P90 TPS (= 1 / TPOT P90), median TPS (= 1 / TPOT P50), TTFT P90 and the AgentX North
Star (interactivity, 1 / P90 of E2E per output token). A slower copy is detected when the
Holm-corrected verdict says it is worse; a "better" verdict is a wrong sign; any verdict on
the identical copy is a false positive. The 3v3 groups are every 3 of the repeats (they
overlap, so their verdicts are not independent). The interleaved designs replay the same
plan against the baseline and one copy at once (``replay.lanes``), each engine a
simulated-engine process of its own, ``repeats`` invocations per copy.

    PYTHONPATH=$PWD/.. python benchmarks/bench_power.py --repeats 6 \\
        --json benchmarks/results/power-YYYY-MM-DD.json          # ~20 min on 2 shared cores
    python benchmarks/bench_power.py --table benchmarks/results/power-YYYY-MM-DD.json

``--table`` prints the Markdown table docs/metrics.md holds (tests/analysis/test_power_doc.py
checks it against the committed results).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "samples" / "agent-small.parquet"
SLOWER = {"same": 0, "slow05": 5, "slow10": 10, "slow25": 25}
"""Target name -> percent slower at decode than the baseline ``base``."""
STATS = {"p90_tps": "P90 TPS (= 1 / TPOT P90)", "median_tps": "TPOT P50 (= 1 / median TPS)",
         "ttft_p90_ms": "TTFT P90", "north_star": "North Star (interactivity)"}
OLD_KEYS = {"north_star": "interactivity"}
"""Keys of results files written before the North Star had its own key (the statistic then
was 1 / P90 of E2E per output token from the connected send)."""
UNSIGNED = frozenset({"ttft_p90_ms"})
"""Statistics whose direction a decode slowdown does not set: on the simulated engine a slower
decode delays each session's next request and TTFT P90 falls. Any verdict on a slowed copy
counts as a detection; the wrong-sign column does not apply."""
UNPAIRED_1V1 = {"p90_tps": "p90_tps", "median_tps": "median_tps", "ttft_p90_ms": "ttft_p90"}
"""The single-run unpaired table's keys for the same statistics (it has no North Star)."""
DESIGNS = ("1v1 unpaired", "1v1 paired", "3v3 unpaired", "3v3 paired", "1v1 interleaved",
           "3v3 interleaved")
DECODE_FIELDS = ("decode_base_ns", "decode_per_seq_ns", "decode_per_ctx_token_ns")

EXPERIMENT = """
trace = "{trace}"
output = "{out}"
repeats = {repeats}
seed = {seed}
[load]
axis = "concurrent_sessions"
points = [{sessions}]
[run]
speedup = {speedup}
duration_s = {duration}
sessions_multiplier = {multiplier}
scrape_interval_s = 0
[warmup]
enabled = false
"""


def profiles(folder: Path) -> dict[str, str]:
    """The sim profile of every target: the shipped default and its slowed copies (same model
    name, so ``compare`` sees one model)."""
    from importlib import resources

    base = json.loads((resources.files("agent_replay.engines.sim") / "profiles" / "default.json").read_text())
    out = {"base": "default"}
    for name, pct in SLOWER.items():
        d = dict(base, name=name)
        for f in DECODE_FIELDS:
            d[f] = type(base[f])(base[f] * (1 + pct / 100))
        path = folder / f"{name}.json"
        path.write_text(json.dumps(d))
        out[name] = str(path)
    return out


def run_sweep_phase(out: Path, args: argparse.Namespace, seed: int) -> Path:
    from agent_replay.replay.sweep import load_experiment, run_sweep

    out.mkdir(parents=True, exist_ok=True)
    text = EXPERIMENT.format(trace=TRACE, out=out / "sweep", repeats=args.repeats, seed=seed,
                             sessions=args.sessions, speedup=args.speedup, duration=args.duration,
                             multiplier=args.multiplier)
    for name, spec in profiles(out).items():
        text += f'[[targets]]\nname = "{name}"\nsim = "{spec}"\n'
    (out / "exp.toml").write_text(text)
    res = run_sweep(load_experiment(out / "exp.toml"), force=True,
                    progress=(lambda line: print("  " + line, file=sys.stderr)) if args.verbose else None)
    return res.out


def run_lanes_phase(out: Path, args: argparse.Namespace, seed: int) -> Path:
    """``repeats`` two-lane invocations of the baseline beside each copy: OUT/lanes/T/rR."""
    from agent_replay.engines.sim import SimProcess
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.lanes import run_lanes

    out.mkdir(parents=True, exist_ok=True)
    specs = profiles(out)
    root = out / "lanes"
    for r in range(args.repeats):
        for t in SLOWER:
            with SimProcess(specs["base"], seed=seed + r) as a, SimProcess(specs[t], seed=seed + r) as b:
                cfg = RunConfig(trace=str(TRACE), target="", output=str(root / t / f"r{r}"),
                                speedup=args.speedup, duration_s=args.duration,
                                concurrent_sessions=args.sessions, scrape_interval_s=0,
                                sessions_multiplier=args.multiplier,
                                progress=False)
                run_lanes(cfg, [a.url, b.url])
            if args.verbose:
                print(f"  lanes {t} r{r} done", file=sys.stderr)
    return root


def count_lanes(root: Path, repeats: int, cells: dict[str, dict[str, int]]) -> int:
    """The interleaved designs' verdicts into ``cells``; the lane runs with host contention."""
    from agent_replay.analysis.compare import ARM_TESTS, compare_arm_reports, compare_reports
    from agent_replay.analysis.report import build_report, self_check

    labels = {key: label for key, label, _ in ARM_TESTS}
    busy = 0
    for t, slower in SLOWER.items():
        pairs = []
        for r in range(repeats):
            lanes = [root / t / f"r{r}" / f"lane-{i}" for i in (1, 2)]
            if all((d / "run.json").is_file() and (d / "requests").is_dir() for d in lanes):
                pairs.append([build_report(d) for d in lanes])
        busy += sum(self_check(x.meta, x.stats).contention for p in pairs for x in p)
        for pair in pairs:
            c = compare_reports(pair, ["base", t])
            by_key = {d.key: d for d in c.deltas[0]}
            for s in STATS:
                _judge(cells[f"1v1 interleaved|{t}|{s}"], _delta_verdict(by_key.get(s)), slower,
                       s not in UNSIGNED)
        for g in itertools.combinations(range(len(pairs)), 3):
            arms = [[pairs[i][0] for i in g], [pairs[i][1] for i in g]]
            c = compare_arm_reports(arms, ["base", t])
            for s in STATS:
                line = next((v for v in c.verdicts if v.startswith(f"{t} vs base, {labels[s]}:")), None)
                v = None if line is None or "95% CI" not in line else (
                    "worse" if line.endswith(": worse") else "better" if line.endswith(": better")
                    else "none")
                _judge(cells[f"3v3 interleaved|{t}|{s}"], v, slower, s not in UNSIGNED)
    return busy


def _cell() -> dict[str, int]:
    return {"tested": 0, "right": 0, "wrong": 0, "refused": 0}


def _judge(cell: dict[str, int], verdict: str | None, slower: int, signed: bool = True) -> None:
    """``verdict``: "worse", "better", "none" (inconclusive), or None (refused / no interval).
    On the identical copy any verdict counts in ``wrong`` (a false positive)."""
    if verdict is None:
        cell["refused"] += 1
        return
    cell["tested"] += 1
    if verdict == "none":
        return
    if not slower:
        cell["wrong"] += 1
    elif verdict == "worse" or not signed:
        cell["right"] += 1
    else:
        cell["wrong"] += 1


def _delta_verdict(d: Any) -> str | None:
    if d is None or d.ci_low is None:
        return None
    if not d.significant:
        return "none"
    return "better" if (d.change > 0) == d.higher_is_better else "worse"


def count(sweep: Path, repeats: int) -> dict[str, Any]:
    """Every design's verdicts on every slowed copy and the identical one."""
    from agent_replay.analysis.compare import ARM_TESTS, compare_arm_reports, compare_reports
    from agent_replay.analysis.frontier import read_sweep
    from agent_replay.analysis.report import build_report

    _, rows = read_sweep(sweep)
    done = {(r["target"], int(r["repeat"])): sweep / r["path"] for r in rows if r["status"] == "complete"}
    reports = {k: build_report(v) for k, v in done.items()}
    busy = sum(1 for r in rows if r.get("machine_contention"))
    cells = {f"{d}|{t}|{s}": _cell() for d in DESIGNS for t in SLOWER for s in STATS}
    labels = {key: label for key, label, _ in ARM_TESTS}
    for t, slower in SLOWER.items():
        reps = [r for r in range(repeats) if ("base", r) in reports and (t, r) in reports]
        for r in reps:
            pair = [reports[("base", r)], reports[(t, r)]]
            for design, paired in (("1v1 unpaired", False), ("1v1 paired", True)):
                c = compare_reports(pair, ["base", t], paired=paired)
                by_key = {d.key: d for d in c.deltas[0]}
                for s in STATS:
                    key = s if paired else UNPAIRED_1V1.get(s)
                    if key is None:
                        continue
                    _judge(cells[f"{design}|{t}|{s}"], _delta_verdict(by_key.get(key)), slower,
                           s not in UNSIGNED)
        for g in itertools.combinations(reps, 3):
            arms = [[reports[("base", r)] for r in g], [reports[(t, r)] for r in g]]
            for design, by_request in (("3v3 unpaired", False), ("3v3 paired", True)):
                c = compare_arm_reports(arms, ["base", t], by_request=by_request)
                for s in STATS:
                    line = next((v for v in c.verdicts if v.startswith(f"{t} vs base, {labels[s]}:")), None)
                    v = None if line is None or "95% CI" not in line else (
                        "worse" if line.endswith(": worse") else "better" if line.endswith(": better")
                        else "none")
                    _judge(cells[f"{design}|{t}|{s}"], v, slower, s not in UNSIGNED)
    lanes = sweep.parent / "lanes"
    lane_busy = count_lanes(lanes, repeats, cells) if lanes.is_dir() else 0
    lane_runs = sum(1 for _ in lanes.glob("*/r*/lane-*/run.json")) if lanes.is_dir() else 0
    return {"runs": len(rows), "complete": len(done), "contention_runs": busy, "cells": cells,
            "lane_runs": lane_runs, "lane_contention_runs": lane_busy}


def _rate(c: dict[str, int], key: str) -> str:
    if not c["tested"]:
        return "-" if not c["refused"] else f"refused {c['refused']}"
    return f"{c[key]}/{c['tested']}"


def table(results: dict[str, Any]) -> str:
    """The Markdown table of docs/metrics.md: per phase, design and statistic, false positives
    on the identical copy, detections (right sign) of each slowdown, and wrong signs."""
    head = ["phase", "design", "statistic", "false pos. (identical)",
            *(f"detected {p}% slower" for p in SLOWER.values() if p), "wrong sign", "refused"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for phase in results["phases"]:
        cells = results[phase]["cells"]
        for design in DESIGNS:
            for s, label in STATS.items():
                row = [cells.get(f"{design}|{t}|{s}")
                       or cells.get(f"{design}|{t}|{OLD_KEYS.get(s, s)}", _cell()) for t in SLOWER]
                if not any(c["tested"] or c["refused"] for c in row):
                    continue
                fp = row[0]
                det = [_rate(c, "right") for c in row[1:]]
                wrong = sum(c["wrong"] for c in row[1:])
                tested = sum(c["tested"] for c in row[1:])
                refused = sum(c["refused"] for c in row)
                lines.append("| " + " | ".join([phase, design, label, _rate(fp, "wrong"), *det,
                                                 "n/a" if s in UNSIGNED else f"{wrong}/{tested}",
                                                 str(refused)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=6, help="repeats of every target per phase (default 6)")
    ap.add_argument("--phases", default="quiet,busy", help="quiet, busy or both (default)")
    ap.add_argument("--sessions", type=int, default=8, help="concurrent sessions per run (default 8)")
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per run (default 8)")
    ap.add_argument("--multiplier", type=int, default=1,
                    help="copies of every session (more requests a run; give the time they need)")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 1,
                    help="CPU burner processes in the busy phase (default: one per core)")
    ap.add_argument("--keep", default=None, help="keep the runs in this folder")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--table", default=None, help="print the table of this results file and exit")
    ap.add_argument("--recount", default=None,
                    help="recount the verdicts of the runs kept in --keep into this results file")
    ap.add_argument("--lanes-only", action="store_true",
                    help="with --keep holding a previous run's sweeps: add the interleaved lanes")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())), end="")
        return 0
    if args.lanes_only:
        from bench_false_positive import cpu_burner

        for i, phase in enumerate(("quiet", "busy")):
            if phase == "busy":
                with cpu_burner(args.burners):
                    run_lanes_phase(Path(args.keep) / phase, args, seed=200 + i)
            else:
                run_lanes_phase(Path(args.keep) / phase, args, seed=200 + i)
        return 0
    if args.recount:
        results = json.loads(Path(args.recount).read_text())
        for phase in results["phases"]:
            results[phase] |= count(Path(args.keep) / phase / "sweep", results["args"]["repeats"])
        Path(args.recount).write_text(json.dumps(results, indent=2) + "\n")
        print(table(results), end="")
        return 0
    from bench_false_positive import cpu_burner

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    kept = ("json", "keep", "table", "recount", "lanes_only")
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k not in kept},
                               "phases": phases, "cpus": os.cpu_count(),
                               "load_before": os.getloadavg()}
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-power-"))
    for i, phase in enumerate(phases):
        t0 = time.monotonic()
        if phase == "busy":
            with cpu_burner(args.burners):
                sweep = run_sweep_phase(base / phase, args, seed=200 + i)
                run_lanes_phase(base / phase, args, seed=200 + i)
        else:
            sweep = run_sweep_phase(base / phase, args, seed=200 + i)
            run_lanes_phase(base / phase, args, seed=200 + i)
        results[phase] = count(sweep, args.repeats) | {"wall_s": round(time.monotonic() - t0, 1),
                                                        "load_after": os.getloadavg()}
        print(f"{phase}: {results[phase]['complete']}/{results[phase]['runs']} runs complete, "
              f"{results[phase]['contention_runs']} with host contention, "
              f"{results[phase]['wall_s']} s", file=sys.stderr)
    print(table(results), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
