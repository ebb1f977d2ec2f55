"""docs/metrics.md's power table and the sentences around it against the committed results
of benchmarks/bench_power.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"


bench = load_script("benchmarks/bench_power.py")


def _block(text: str) -> tuple[Path, str]:
    m = re.search(r"<!-- power table: (\S+) -->\n(.*?)<!-- end power table -->", text, re.S)
    assert m is not None, "no power table in docs/metrics.md"
    return ROOT / m.group(1), m.group(2)


def test_power_table_is_the_committed_results() -> None:
    path, block = _block(DOC.read_text())
    results = json.loads(path.read_text())
    assert block == bench.table(results)
    args = results["args"]
    text = DOC.read_text()
    example = json.loads((ROOT / "benchmarks/results/paired-example/lane-1/run.json").read_text())
    assert (f"({args['repeats']} repeats, {args['sessions']} sessions at once, "
            f"{args['duration']:g} s runs: {example['planned']['requests']} requests a run)"
            ) in " ".join(text.split())
    # "every run's self-check found host contention" in both phases
    assert results["phases"] == ["quiet", "busy"]
    assert all(results[p]["contention_runs"] == results[p]["runs"] and
               results[p]["lane_contention_runs"] == results[p]["lane_runs"] > 0
               for p in results["phases"])
    # "no design gives a false positive or a wrong sign"
    cells = [c for p in results["phases"] for c in results[p]["cells"].values()]
    assert sum(c["wrong"] for c in cells) == 0
    # "the interleaved 3v3 finds a 25% slowdown at P90 TPS every time and a 10% one in 10
    # and 5 of 20 groups"
    got = [(results[p]["cells"][f"3v3 interleaved|{t}|p90_tps"]["right"],
            results[p]["cells"][f"3v3 interleaved|{t}|p90_tps"]["tested"])
           for t in ("slow25", "slow10") for p in ("quiet", "busy")]
    assert got == [(20, 20), (20, 20), (10, 20), (5, 20)]
    assert "every time and a 10% one in 10 and 5 of 20 groups" in " ".join(text.split())


def test_a_changed_cell_fails() -> None:
    path, block = _block(DOC.read_text())
    row = block.splitlines()[2]
    assert block.replace(row, row.replace("/", "1/", 1)) != bench.table(json.loads(path.read_text()))


def test_table_counts_by_hand() -> None:
    cells = {f"{d}|{t}|{s}": bench._cell() for d in bench.DESIGNS for t in bench.SLOWER for s in bench.STATS}
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
    line = next(ln for ln in bench.table({"phases": ["quiet"], "quiet": {"cells": cells}}).splitlines()
                if "| 1v1 paired | P90 TPS" in ln)
    assert line == "| quiet | 1v1 paired | P90 TPS (= 1 / TPOT P90) | 2/3 | - | 2/4 | - | 1/4 | 1 |"


def test_readme_paired_example_is_what_compare_prints() -> None:
    from agent_replay.analysis.compare import compare_dirs

    ex = ROOT / "benchmarks" / "results" / "paired-example"
    c = compare_dirs([ex / "lane-1", ex / "lane-2"])
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("    lane-2 is 9% slower at P90 TPS"):]
    shown = [ln.strip() for ln in block.split("\n\n")[0].splitlines()]
    assert shown == [v for v in c.verdicts if not v.startswith("Verdicts are Holm")]
    assert "paired" in shown[-1]
