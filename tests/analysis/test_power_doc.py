"""docs/metrics.md's power table and the sentences around it against the committed results
of benchmarks/bench_power.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"


bench = load_script("benchmarks/bench_power.py")


def _block(text: str) -> tuple[Path, str]:
    m = bench.DOC_BLOCK.search(text)
    assert m is not None, "no power table in docs/metrics.md"
    return ROOT / m.group(1), m.group(0)


def test_power_table_is_the_committed_results() -> None:
    path, block = _block(DOC.read_text())
    results = json.loads(path.read_text())
    assert block == bench.doc_block(path.relative_to(ROOT).as_posix(), results)
    assert results["phases"] == ["quiet", "busy"]
    assert all(
        results[p]["lane_runs"] > 0 and results[p]["requests_per_run"] > 0
        for p in results["phases"]
    )


def test_write_doc_puts_a_fresh_results_file_in(tmp_path: Path) -> None:
    path, _ = _block(DOC.read_text())
    fresh = tmp_path / "power-2027-01-01.json"
    fresh.write_text(path.read_text())
    doc = tmp_path / "metrics.md"
    doc.write_text("before\n<!-- power table: x.json -->\nold\n<!-- end power table -->\nafter\n")
    bench.write_doc(doc, fresh)
    text = doc.read_text()
    name = Path(os.path.relpath(fresh, ROOT)).as_posix()
    assert text == f"before\n{bench.doc_block(name, json.loads(fresh.read_text()))}\nafter\n"
    assert f"<!-- power table: {name} -->" in text


def test_summary_by_hand() -> None:
    cells = {
        f"{d}|{t}|{s}": bench._cell()
        for d in bench.DESIGNS
        for t in bench.SLOWER
        for s in bench.STATS
    }
    for v in ("worse", "worse", "none"):
        bench._judge(cells["1v1 interleaved|slow10|p90_tps"], v, 10)
    bench._judge(cells["3v3 paired|same|median_tps"], "better", 0)  # a false positive
    bench._judge(cells["3v3 paired|slow25|median_tps"], "better", 25)  # a wrong sign
    bench._judge(cells["3v3 paired|slow25|ttft_p90_ms"], "better", 25, signed=False)  # no sign
    # signed verdicts on slower copies: 3 at P90 TPS and 1 at median TPS (TTFT has no sign)
    phase = {
        "cells": cells,
        "runs": 30,
        "contention_runs": 2,
        "lane_runs": 48,
        "lane_contention_runs": 0,
        "requests_per_run": 57,
    }
    results = {
        "args": {"repeats": 6, "sessions": 8, "duration": 8.0, "speedup": 10.0},
        "phases": ["quiet"],
        "load_before": [0.42, 0, 0],
        "quiet": phase,
    }
    assert bench.summary(results).splitlines() == [
        "6 repeats of each copy, 8 sessions at once at speedup 10, sending for at most 8 s: 57 "
        "requests a run. "
        "Load average 0.4 before the first phase.",
        "Quiet: host contention in 2 of 30 sweep runs and 0 of 48 lane runs; 1 false positives "
        "in 1 verdicts on the identical copy, 1 wrong signs in 4 on the slower ones; a 10% "
        "slowdown found at P90 TPS in 0/0 (3v3 paired), 2/3 (1v1 interleaved), 0/0 (3v3 "
        "interleaved).",
    ]


def test_a_changed_cell_fails() -> None:
    path, block = _block(DOC.read_text())
    row = next(ln for ln in block.splitlines() if ln.startswith("| quiet |"))
    changed = block.replace(row, row.replace("/", "1/", 1))
    assert changed != block
    assert changed != bench.doc_block(
        path.relative_to(ROOT).as_posix(), json.loads(path.read_text())
    )


def test_table_counts_by_hand() -> None:
    cells = {
        f"{d}|{t}|{s}": bench._cell()
        for d in bench.DESIGNS
        for t in bench.SLOWER
        for s in bench.STATS
    }
    c = cells["1v1 paired|slow10|p90_tps"]
    for v in ("worse", "worse", "none", "better", None):
        bench._judge(c, v, 10)
    assert c == {"tested": 4, "right": 2, "wrong": 1, "refused": 1}
    fp = cells["1v1 paired|same|p90_tps"]
    for v in ("none", "worse", "better"):
        bench._judge(fp, v, 0)
    assert fp == {"tested": 3, "right": 0, "wrong": 2, "refused": 0}
    ttft = cells["1v1 paired|slow10|ttft_p90_ms"]
    bench._judge(ttft, "better", 10, signed=False)
    assert ttft["right"] == 1 and ttft["wrong"] == 0
    line = next(
        ln
        for ln in bench.table({"phases": ["quiet"], "quiet": {"cells": cells}}).splitlines()
        if "| 1v1 paired | P90 TPS" in ln
    )
    assert line == "| quiet | 1v1 paired | P90 TPS (= 1 / TPOT P90) | 2/3 | - | 2/4 | - | 1/4 | 1 |"


def test_readme_paired_example_is_what_compare_prints() -> None:
    from agent_replay.analysis.compare import compare_dirs

    ex = ROOT / "benchmarks" / "results" / "paired-example"
    c = compare_dirs([ex / "lane-1", ex / "lane-2"])
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("    lane-2 is 9% slower at P90 TPS") :]
    shown = [ln.strip() for ln in block.split("\n\n")[0].splitlines()]
    assert shown == [v for v in c.verdicts if not v.startswith("Verdicts are Holm")]
    assert "paired" in shown[-1]


def test_a_change_inside_the_margin_counts_as_no_verdict() -> None:
    from agent_replay.analysis.compare import Delta

    # P90 TPS 0.6% lower, 95% CI -0.8% to -0.4%, p = 0.001: slower, unless 1% is the margin
    d = Delta("p90_tps", "P90 TPS", 100.0, 99.4, -0.006, -0.008, -0.004, True, p=0.001)
    assert bench._delta_verdict(d) == "worse"
    assert bench._delta_verdict(d, 0.01) == "none"
    assert bench._delta_verdict(d, 0.005) == "worse"  # -0.8% reaches past 0.5%
    cell = bench._cell()
    bench._judge(cell, bench._delta_verdict(d, 0.01), 0)  # on the identical copy
    assert cell == {"tested": 1, "right": 0, "wrong": 0, "refused": 0}
