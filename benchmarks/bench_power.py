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
simulated-engine process of its own, started once per phase, ``repeats`` invocations per
copy, the copies taking turns within each repeat.

Each run replays 16 sessions at once (the sample trace's 8 and a clone of each: 114
requests); the duration is a cap that a healthy run does not reach, so that a slow run still
sends every request and its twins stay paired. The P90 of a run is its 12th slowest request:
with the 8 sessions alone (57 requests, the 6th slowest) one engine's scheduling hiccup on a
loaded host moved it more than a 10% slowdown does.

    PYTHONPATH=$PWD python benchmarks/bench_power.py \\
        --json benchmarks/results/power-YYYY-MM-DD.json   # both phases, ~20 min on 2 cores
    python benchmarks/bench_power.py --table benchmarks/results/power-YYYY-MM-DD.json
    python benchmarks/bench_power.py --doc benchmarks/results/power-YYYY-MM-DD.json

``--table`` prints the summary and the table; ``--doc`` puts them into docs/metrics.md under
a marker naming the file, which tests/analysis/test_power_doc.py checks against it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
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
STATS = {
    "p90_tps": "P90 TPS (= 1 / TPOT P90)",
    "median_tps": "TPOT P50 (= 1 / median TPS)",
    "ttft_p90_ms": "TTFT P90",
    "north_star": "North Star (interactivity)",
}
OLD_KEYS = {"north_star": "interactivity"}
"""Keys of results files written before the North Star had its own key (the statistic then
was 1 / P90 of E2E per output token from the connected send)."""
UNSIGNED = frozenset({"ttft_p90_ms"})
"""Statistics whose direction a decode slowdown does not set: on the simulated engine a slower
decode delays each session's next request and TTFT P90 falls. Any verdict on a slowed copy
counts as a detection; the wrong-sign column does not apply."""
UNPAIRED_1V1 = {"p90_tps": "p90_tps", "median_tps": "median_tps", "ttft_p90_ms": "ttft_p90"}
"""The single-run unpaired table's keys for the same statistics (it has no North Star)."""
DESIGNS = (
    "1v1 unpaired",
    "1v1 paired",
    "3v3 unpaired",
    "3v3 paired",
    "1v1 interleaved",
    "3v3 interleaved",
)
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

    base = json.loads(
        (resources.files("agent_replay.engines.sim") / "profiles" / "default.json").read_text()
    )
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
    text = EXPERIMENT.format(
        trace=TRACE,
        out=out / "sweep",
        repeats=args.repeats,
        seed=seed,
        sessions=args.sessions,
        speedup=args.speedup,
        duration=args.duration,
        multiplier=args.multiplier,
    )
    for name, spec in profiles(out).items():
        text += f'[[targets]]\nname = "{name}"\nsim = "{spec}"\n'
    (out / "exp.toml").write_text(text)
    res = run_sweep(
        load_experiment(out / "exp.toml"),
        force=True,
        progress=(lambda line: print("  " + line, file=sys.stderr)) if args.verbose else None,
    )
    return res.out


def lane_config(args: argparse.Namespace, output: Path) -> Any:
    """One ``run --targets`` invocation's options (the targets are given to ``run_lanes``)."""
    from agent_replay.replay.config import RunConfig

    return RunConfig(
        trace=str(TRACE),
        target="",
        output=str(output),
        speedup=args.speedup,
        duration_s=args.duration,
        concurrent_sessions=args.sessions,
        scrape_interval_s=0,
        sessions_multiplier=args.multiplier,
        progress=False,
    )


def run_lanes_phase(out: Path, args: argparse.Namespace, seed: int) -> Path:
    """``repeats`` two-lane invocations of the baseline beside each copy: OUT/lanes/T/rR.
    Every engine is started once for the phase (as the sweep's are) and the copies take
    turns within each repeat, so a slow spell of the host falls on all of them alike."""
    from agent_replay.engines.sim import SimProcess
    from agent_replay.replay.lanes import run_lanes

    out.mkdir(parents=True, exist_ok=True)
    specs = profiles(out)
    root = out / "lanes"
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(SimProcess(spec, seed=seed)) for name, spec in specs.items()
        }
        for r in range(args.repeats):
            for t in SLOWER:
                run_lanes(lane_config(args, root / t / f"r{r}"), [sims["base"].url, sims[t].url])
                if args.verbose:
                    print(f"  lanes {t} r{r} done", file=sys.stderr)
    return root


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


def _delta_verdict(d: Any, margin: float = 0.0) -> str | None:
    if d is None or d.ci_low is None:
        return None
    if not d.finding(margin):
        return "none"
    return "better" if (d.change > 0) == d.higher_is_better else "worse"


def _arm_verdict(verdicts: list[str], head: str) -> str | None:
    """The verdict of one replicate-arm test (its line starts with ``head``)."""
    line = next((v for v in verdicts if v.startswith(head)), None)
    if line is None or "95% CI" not in line:
        return None
    return (
        "worse" if line.endswith(": worse") else "better" if line.endswith(": better") else "none"
    )


class Counter:
    """Every design's verdicts on every copy, and the estimated changes behind them."""

    def __init__(self, margin: float = 0.0) -> None:
        self.margin = margin
        """``compare --margin``: a change inside it is no finding."""
        self.cells = {f"{d}|{t}|{s}": _cell() for d in DESIGNS for t in SLOWER for s in STATS}
        self.changes: dict[str, list[float]] = {}
        self.requests: list[int] = []

    def record(
        self, design: str, t: str, s: str, verdict: str | None, change: float | None
    ) -> None:
        _judge(self.cells[f"{design}|{t}|{s}"], verdict, SLOWER[t], s not in UNSIGNED)
        if change is not None:
            self.changes.setdefault(f"{design}|{t}|{s}", []).append(round(change, 5))

    def pair(self, design: str, t: str, pair: Any, paired: bool = True) -> None:
        """One run pair ``(base, copy)`` compared as ``compare A B``."""
        from agent_replay.analysis.compare import compare_reports

        c = compare_reports(list(pair), ["base", t], paired=paired, margin=self.margin)
        by_key = {d.key: d for d in c.deltas[0]}
        for s in STATS:
            d = by_key.get(s if paired else UNPAIRED_1V1.get(s, ""))
            if d is not None or paired:
                verdict = _delta_verdict(d, self.margin)
                self.record(design, t, s, verdict, None if d is None else d.change)

    def groups(self, design: str, t: str, pairs: list[Any], by_request: bool = True) -> None:
        """Every 3 of the run pairs compared as ``compare A1,A2,A3 B1,B2,B3``."""
        from agent_replay.analysis.compare import ARM_TESTS, compare_arm_reports

        labels = {key: label for key, label, _ in ARM_TESTS}
        for g in itertools.combinations(pairs, 3):
            c = compare_arm_reports(
                [[p[0] for p in g], [p[1] for p in g]],
                ["base", t],
                by_request=by_request,
                margin=self.margin,
            )
            for s in STATS:
                self.record(
                    design, t, s, _arm_verdict(c.verdicts, f"{t} vs base, {labels[s]}:"), None
                )

    def result(self) -> dict[str, Any]:
        return {
            "cells": self.cells,
            "changes": self.changes,
            "requests_per_run": sorted(self.requests)[len(self.requests) // 2]
            if self.requests
            else 0,
        }


def _busy(reports: Any) -> int:
    from agent_replay.analysis.report import self_check

    return sum(1 for r in reports if self_check(r.meta, r.stats).contention)


def _lane_pairs(root: Path, t: str, repeats: int) -> list[tuple[Any, ...]]:
    """The (base, copy) lane reports of every complete invocation of copy ``t``."""
    from agent_replay.analysis.report import build_report

    pairs = []
    for r in range(repeats):
        lanes = [root / t / f"r{r}" / f"lane-{i}" for i in (1, 2)]
        if all((d / "run.json").is_file() and (d / "requests").is_dir() for d in lanes):
            pairs.append(tuple(build_report(d) for d in lanes))
    return pairs


def count_lanes(root: Path, repeats: int, counter: Counter) -> int:
    """The interleaved designs' verdicts into ``counter``; the lane runs with host contention."""
    busy = 0
    for t in SLOWER:
        pairs = _lane_pairs(root, t, repeats)
        busy += sum(_busy(p) for p in pairs)
        counter.requests += [x.stats.requests["ok"] for p in pairs for x in p]
        for pair in pairs:
            counter.pair("1v1 interleaved", t, pair)
        counter.groups("3v3 interleaved", t, pairs)
    return busy


def _sweep_reports(sweep: Path) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Any]]:
    """The sweep's rows and the report of each complete run, by (target, repeat)."""
    from agent_replay.analysis.frontier import read_sweep
    from agent_replay.analysis.report import build_report

    _, rows = read_sweep(sweep)
    return rows, {
        (r["target"], int(r["repeat"])): build_report(sweep / r["path"])
        for r in rows
        if r["status"] == "complete"
    }


def count_sweep(sweep: Path, repeats: int, counter: Counter) -> dict[str, int]:
    """The sweep designs' verdicts into ``counter``: runs made one after the other."""
    rows, reports = _sweep_reports(sweep)
    for t in SLOWER:
        pairs = [
            (reports[("base", r)], reports[(t, r)])
            for r in range(repeats)
            if ("base", r) in reports and (t, r) in reports
        ]
        for pair in pairs:
            counter.pair("1v1 unpaired", t, pair, paired=False)
            counter.pair("1v1 paired", t, pair)
        counter.groups("3v3 unpaired", t, pairs, by_request=False)
        counter.groups("3v3 paired", t, pairs)
    return {
        "runs": len(rows),
        "complete": len(reports),
        "contention_runs": sum(1 for r in rows if r.get("machine_contention")),
    }


def count(sweep: Path, repeats: int, margin: float = 0.0) -> dict[str, Any]:
    """Every design's verdicts on every slowed copy and the identical one (``compare
    --margin`` ``margin``)."""
    counter = Counter(margin)
    out: dict[str, Any] = (
        count_sweep(sweep, repeats, counter)
        if sweep.is_dir()
        else {"runs": 0, "complete": 0, "contention_runs": 0}
    )
    lanes = sweep.parent / "lanes"
    out["lane_contention_runs"] = count_lanes(lanes, repeats, counter) if lanes.is_dir() else 0
    out["lane_runs"] = sum(1 for _ in lanes.glob("*/r*/lane-*/run.json")) if lanes.is_dir() else 0
    return out | counter.result()


def _rate(c: dict[str, int], key: str) -> str:
    if not c["tested"]:
        return "-" if not c["refused"] else f"refused {c['refused']}"
    return f"{c[key]}/{c['tested']}"


def _cell_of(cells: dict[str, Any], key: str, s: str) -> dict[str, int]:
    """A cell of a results file, by the statistic's key or the one older files used."""
    return cells.get(f"{key}|{s}") or cells.get(f"{key}|{OLD_KEYS.get(s, s)}", _cell())


def _row(phase: str, design: str, s: str, cells: dict[str, Any]) -> str | None:
    row = [_cell_of(cells, f"{design}|{t}", s) for t in SLOWER]
    if not any(c["tested"] or c["refused"] for c in row):
        return None
    wrong = sum(c["wrong"] for c in row[1:])
    tested = sum(c["tested"] for c in row[1:])
    return (
        "| "
        + " | ".join(
            [
                phase,
                design,
                STATS[s],
                _rate(row[0], "wrong"),
                *(_rate(c, "right") for c in row[1:]),
                "n/a" if s in UNSIGNED else f"{wrong}/{tested}",
                str(sum(c["refused"] for c in row)),
            ]
        )
        + " |"
    )


def table(results: dict[str, Any]) -> str:
    """The Markdown table of docs/metrics.md: per phase, design and statistic, false positives
    on the identical copy, detections (right sign) of each slowdown, and wrong signs."""
    head = [
        "phase",
        "design",
        "statistic",
        "false pos. (identical)",
        *(f"detected {p}% slower" for p in SLOWER.values() if p),
        "wrong sign",
        "refused",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = (
        _row(ph, d, s, results[ph]["cells"])
        for ph in results["phases"]
        for d in DESIGNS
        for s in STATS
    )
    return "\n".join([*lines, *(r for r in rows if r is not None)]) + "\n"


TARGET_DESIGNS = ("3v3 paired", "1v1 interleaved", "3v3 interleaved")
"""The paired designs whose detection of a 10% slowdown the summary states."""


def _sum(cells: dict[str, Any], keys: Any, field: str) -> tuple[int, int]:
    got = [cells[k] for k in keys if k in cells]
    return sum(c[field] for c in got), sum(c["tested"] for c in got)


def summary(results: dict[str, Any]) -> str:
    """The sentences beside the table: the setup, the host, false positives and wrong signs,
    and the detection of a 10% decode slowdown at P90 TPS (= 1 / TPOT P90)."""
    a = results["args"]
    out = [
        f"{a['repeats']} repeats of each copy, {a['sessions']} sessions at once at speedup "
        f"{a['speedup']:g}, sending for at most {a['duration']:g} s: "
        f"{results[results['phases'][0]].get('requests_per_run', 0)} requests a run. "
        f"Load average {results['load_before'][0]:.1f} before the first phase."
    ]
    for ph in results["phases"]:
        r, cells = results[ph], results[ph]["cells"]
        fp = _sum(cells, [k for k in cells if "|same|" in k], "wrong")
        wrong = _sum(
            cells,
            [k for k in cells if "|same|" not in k and not k.endswith(tuple(UNSIGNED))],
            "wrong",
        )
        det = [
            f"{'{}/{}'.format(*_sum(cells, [f'{d}|slow10|p90_tps'], 'right'))} ({d})"
            for d in TARGET_DESIGNS
        ]
        out.append(
            f"{ph.capitalize()}: host contention in {r['contention_runs']} of {r['runs']} "
            f"sweep runs and {r['lane_contention_runs']} of {r['lane_runs']} lane runs; "
            f"{fp[0]} false positives in {fp[1]} verdicts on the identical copy, "
            f"{wrong[0]} wrong signs in {wrong[1]} on the slower ones; a 10% slowdown "
            f"found at P90 TPS in {', '.join(det)}."
        )
    return "\n".join(out) + "\n"


def doc_block(path: str, results: dict[str, Any]) -> str:
    """docs/metrics.md's generated part: the marker naming the results file, the summary and
    the table."""
    return (
        f"<!-- power table: {path} -->\n{summary(results)}\n{table(results)}"
        "<!-- end power table -->"
    )


DOC_BLOCK = re.compile(r"<!-- power table: (\S+) -->\n.*?<!-- end power table -->", re.S)


def write_doc(doc: Path, results: Path) -> None:
    """Replace the generated part of ``doc`` by the one of results file ``results``."""
    text = doc.read_text()
    if not DOC_BLOCK.search(text):
        raise SystemExit(f"{doc}: no '<!-- power table: ... -->' block to replace")
    path = Path(os.path.relpath(results.resolve(), ROOT)).as_posix()
    block = doc_block(path, json.loads(results.read_text()))
    doc.write_text(DOC_BLOCK.sub(lambda _: block, text, count=1))


def run_phases(args: argparse.Namespace) -> dict[str, Any]:
    """Both phases: the sweep and the lanes, quiet, then beside a CPU burner per core."""
    from bench_false_positive import cpu_burner

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    kept = ("json", "keep", "table", "recount", "doc")
    results: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k not in kept},
        "phases": phases,
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-power-"))
    for i, phase in enumerate(phases):
        t0 = time.monotonic()
        with cpu_burner(args.burners if phase == "busy" else 0):
            sweep = run_sweep_phase(base / phase, args, seed=200 + i)
            run_lanes_phase(base / phase, args, seed=200 + i)
        results[phase] = count(sweep, args.repeats) | {
            "wall_s": round(time.monotonic() - t0, 1),
            "load_after": os.getloadavg(),
        }
        print(
            f"{phase}: {results[phase]['complete']}/{results[phase]['runs']} sweep runs complete, "
            f"{results[phase]['contention_runs']} and {results[phase]['lane_contention_runs']} "
            f"lane runs with host contention, {results[phase]['wall_s']} s",
            file=sys.stderr,
        )
    return results


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repeats", type=int, default=6, help="repeats of every target per phase (default 6)"
    )
    ap.add_argument("--phases", default="quiet,busy", help="quiet, busy or both (default)")
    ap.add_argument(
        "--sessions", type=int, default=16, help="concurrent sessions per run (default 16)"
    )
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="most seconds a run sends requests (default 30: a cap, runs end sooner)",
    )
    ap.add_argument(
        "--multiplier",
        type=int,
        default=2,
        help="copies of every session (more requests a run; give the time they need)",
    )
    ap.add_argument(
        "--burners",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU burner processes in the busy phase (default: one per core)",
    )
    ap.add_argument("--keep", default=None, help="keep the runs in this folder")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--table", default=None, help="print the table of this results file and exit")
    ap.add_argument(
        "--doc",
        default=None,
        help="put this results file's summary and table into docs/metrics.md and exit",
    )
    ap.add_argument(
        "--recount",
        default=None,
        help="recount the verdicts of the runs kept in --keep into this results file",
    )
    ap.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="with --recount: judge as `compare --margin` (a fraction: 0.01 is 1%%)",
    )
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.table:
        results = json.loads(Path(args.table).read_text())
        print(summary(results) + "\n" + table(results), end="")
        return 0
    if args.doc:
        write_doc(ROOT / "docs" / "metrics.md", Path(args.doc))
        return 0
    if args.recount:
        results = json.loads(Path(args.recount).read_text())
        results["margin"] = args.margin
        for phase in results["phases"]:
            sweep = Path(args.keep) / phase / "sweep"
            results[phase] |= count(sweep, results["args"]["repeats"], args.margin)
    else:
        results = run_phases(args)
    print(table(results), end="")
    if args.json or args.recount:
        Path(args.json or args.recount).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
