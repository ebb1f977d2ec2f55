"""docs/gpu.md against the committed H200 data, and the statistics its tables use."""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-03-h200-mtp"


def _load() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("mtp_doc", ROOT / "benchmarks/gpu/mtp_doc.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mtp_doc"] = mod
    spec.loader.exec_module(mod)
    return mod


doc = _load()


def test_t_two_sided_p_matches_the_tables() -> None:
    # 97.5% quantiles of Student's t: two-sided p = 0.05 there
    for t, df in ((12.706, 1), (4.303, 2), (3.182, 3), (2.776, 4), (2.571, 5), (2.228, 10)):
        assert doc.t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-4)
    assert doc.t_two_sided_p(0.0, 4) == 1.0
    assert doc.t_two_sided_p(1.0, 1) == pytest.approx(0.5)  # Cauchy: 1 - 2/pi * atan(1)
    assert doc.t_quantile(0.95, 4) == pytest.approx(2.776, abs=1e-3)


def test_holm_by_hand() -> None:
    # sorted: 0.01 * 3 = 0.03; 0.03 * 2 = 0.06; 0.04 * 1 = 0.04 -> kept at 0.06 (monotone)
    assert doc.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert doc.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_log_ratio_effect_by_hand() -> None:
    # ratios 2 and 8: mean log = ln 4, so +300%; sd of (ln 2, ln 8) = ln 4 / sqrt 2;
    # t = ln 4 / (sd / sqrt 2) = 2 with 1 df: p = 1 - 2/pi * atan(2)
    (e,) = doc.log_ratio_effects([([1.0, 1.0], [2.0, 8.0])])
    assert e.estimate == pytest.approx(3.0)
    assert e.p == pytest.approx(1 - 2 / math.pi * math.atan(2.0))
    assert e.p_holm == e.p and e.level == pytest.approx(0.95)
    half = 12.706 * (math.log(4) / math.sqrt(2)) / math.sqrt(2)
    assert e.low == pytest.approx(math.expm1(math.log(4) - half), rel=1e-3)
    assert e.high == pytest.approx(math.expm1(math.log(4) + half), rel=1e-3)
    # two tests: the smaller p is tested at 1 - 0.05/2, the larger at 0.95
    a, b = doc.log_ratio_effects([([1.0, 1.0, 1.0], [2.0, 2.1, 1.9]),
                                  ([1.0, 1.0, 1.0], [1.0, 1.5, 0.8])])
    assert a.level == pytest.approx(0.975) and b.level == pytest.approx(0.95)
    assert a.p_holm == pytest.approx(2 * a.p)


def test_nearest_rank() -> None:
    assert doc.nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert doc.nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 90) == 5.0


def test_doc_holds_every_figure_of_the_data() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    assert doc.missing(text) == []
    assert doc.readme_table(doc.index()) in (ROOT / "README.md").read_text()


def test_a_changed_number_fails() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    blocks = doc.blocks()
    row = blocks["effects table"].splitlines()[2]
    assert row in text
    assert doc.missing(text.replace(row, row.replace("%", "1%", 1))) == ["effects table"]
    sentence = blocks["bench sentence"]
    assert "overlapped for" in sentence
    assert sentence in text
    changed = text.replace(sentence, sentence.replace("overlapped for ", "overlapped for 1"))
    assert doc.missing(changed) == ["bench sentence"]


def test_index_figures_are_the_run_folders() -> None:
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report

    rows = doc.index(RUN)
    for r in (rows[0], rows[-1]):
        rep = build_report(RUN / "mtp" / str(r["path"]), gpus=1)
        figures = point_metrics(rep, 1, 3.5)
        for key in ("p90_tps", "output_tps_per_gpu", "ttft_p99_ms"):
            assert figures[key] == pytest.approx(r[key], rel=1e-9)


def test_profiles_differ_from_standard_as_the_doc_says() -> None:
    import json

    diffs = {n: [d["flag"] for d in json.loads((RUN / f"results/{n}.diff.json").read_text())["diff"]]
             for n in ("std", "mtp", "ded")}
    assert diffs == {"std": [], "mtp": ["--speculative-config"],
                     "ded": ["--performance-mode", "--max-num-seqs",
                             "--prefill-schedule-interval", "--speculative-config"]}


def test_intervals_leave_out_zero_exactly_where_holm_rejects() -> None:
    for e in doc.effects(doc.index(RUN)).values():
        assert (e.p_holm < doc.ALPHA) == (e.low > 0 or e.high < 0)


def test_every_target_got_the_same_requests_at_each_point_and_repeat() -> None:
    salts: dict[tuple[float, int], set[int]] = {}
    for r in doc.index(RUN):
        salts.setdefault((float(str(r["point"])), int(str(r["repeat"]))), set()).add(
            int(str(r["salt"])))
    assert len(salts) == 20 and all(len(v) == 1 for v in salts.values())
