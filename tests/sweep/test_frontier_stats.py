"""The frontier is the non-dominated set; run-level intervals and verdicts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agent_replay.analysis.frontier import pareto_mask, points, to_markdown
from agent_replay.analysis.replicates import mean_ci, paired_ci, t975, verdict


def test_pareto_mask_is_exactly_the_non_dominated_points() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        xy = [(float(a), float(b)) for a, b in rng.integers(0, 6, size=(n, 2))]
        mask = pareto_mask(xy)
        for i, (x, y) in enumerate(xy):
            beaten = any(x2 >= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in xy)
            assert mask[i] == (not beaten), (xy, i)
    # hand example: (1, 10) and (10, 1) and (5, 5) are all on it; (4, 4) is not; ties both stay
    assert pareto_mask([(1, 10), (10, 1), (5, 5), (4, 4), (5, 5)]) == [True, True, True, False, True]


def test_an_interval_on_a_positive_quantity_stops_at_zero() -> None:
    # mean 40, sd 52.9, t(2) 4.303: half-width 131.4, so t alone says [-91.4, 171.4]
    ci = mean_ci([100.0, 10.0, 10.0])
    assert ci.low == pytest.approx(40 - 4.303 * 51.9615 / 3 ** 0.5, rel=1e-4) and ci.low < 0
    cut = mean_ci([100.0, 10.0, 10.0], lower=0.0)
    assert (cut.estimate, cut.low, cut.high) == (ci.estimate, 0.0, ci.high)
    assert "cut at 0" in cut.method
    pts = points([{"target": "a", "point": 1.0, "repeat": i, "status": "complete",
                   "p90_tps": v} for i, v in enumerate((100.0, 10.0, 10.0))])
    assert pts[0].ci["p90_tps"].low == 0.0  # the frontier's intervals never go below zero


def test_mean_ci_hand_computed() -> None:
    ci = mean_ci([10.0, 12.0, 14.0])  # mean 12, sd 2, se 2/sqrt(3), t(2) = 4.303
    half = 4.303 * 2 / math.sqrt(3)
    assert ci.estimate == pytest.approx(12.0)
    assert (ci.low, ci.high) == (pytest.approx(12 - half), pytest.approx(12 + half))
    one = mean_ci([5.0])
    assert one.estimate == 5.0 and one.low is None


def test_paired_ci_hand_computed_and_verdicts() -> None:
    a, b = [100.0, 110.0, 90.0], [110.0, 118.0, 102.0]  # d = 10, 8, 12: mean 10, sd 2
    ci = paired_ci(a, b)
    half = 4.303 * 2 / math.sqrt(3) / 100.0
    assert ci.estimate == pytest.approx(0.10) and ci.high == pytest.approx(0.10 + half)
    assert ci.excludes_zero and "better" in verdict("P90 TPS", ci)
    # between-run spread larger than the difference: inconclusive
    wide = paired_ci([100.0, 150.0, 60.0], [104.0, 140.0, 75.0])
    assert not wide.excludes_zero and "inconclusive" in verdict("P90 TPS", wide)
    assert "inconclusive" in verdict("x", paired_ci([1.0], [2.0]))
    assert t975(2) == pytest.approx(4.303) and t975(1000) == pytest.approx(1.96, abs=0.01)


def test_interval_of_identical_targets_contains_zero_in_95_percent() -> None:
    # two identical arms with run-to-run noise: the 95% paired interval covers 0 in ~95% of
    # trials (a test that the interval is not too narrow)
    rng = np.random.default_rng(11)
    hits = sum(not paired_ci(list(x), list(y)).excludes_zero
               for x, y in (rng.normal(100, 15, size=(2, 3)) for _ in range(2000)))
    assert 0.93 <= hits / 2000 <= 0.97


def _row(target: str, point: float, rep: int, tps: float, thr: float, status: str = "complete") -> dict:
    return {"phase": "sweep", "target": target, "point": point, "repeat": rep, "status": status,
            "reason": None if status == "complete" else "boom", "order": rep, "p90_tps": tps,
            "output_tps_per_gpu": thr, "interactivity": tps / 2, "total_tps_per_gpu": thr * 3}


def test_frontier_table_marks_and_keeps_failed_points() -> None:
    rows = [_row("a", p, r, tps, thr) for r in range(3) for p, tps, thr in
            ((1, 50, 100), (2, 40, 180), (4, 30, 170), (8, 20, 300))]
    rows.append(_row("a", 16, 0, 0, 0, status="unreachable"))
    pts = points(rows)
    md = to_markdown(pts, "concurrent_sessions")
    lines = {ln.split(" | ")[2]: ln for ln in md.splitlines() if ln.startswith("|  | a")}
    assert "*" in lines["1"] and "*" in lines["2"] and "*" in lines["8"]
    assert "*" not in lines["4"]  # (30, 170) is beaten by (40, 180)
    assert "r0 unreachable: boom" in lines["16"]
    assert set(itertools.chain.from_iterable(p.on_frontier for p in pts)) == {
        "p90_tps:output_tps_per_gpu", "interactivity:output_tps_per_gpu"}


def test_build_writes_tables_and_plots_and_skips_plots_without_matplotlib(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    from agent_replay.analysis.frontier import build
    from agent_replay.replay.sweep.index import write_index

    rows = []
    for r in range(2):
        for p, tps, thr in ((1, 50, 100), (4, 30, 300)):
            row = _row("a", p, r, tps + r, thr + r) | {"phase": "sweep", "order": r * 2 + p}
            rows.append(row)
    write_index(tmp_path, rows)
    res = build([tmp_path])
    names = sorted(f.name for f in res["files"])
    assert names == ["frontier-interactivity-total.png", "frontier-interactivity.png",
                     "frontier-p90_tps-total.png", "frontier-p90_tps.png", "frontier.json", "frontier.md"]
    assert (tmp_path / "frontier-p90_tps.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the plots extra not installed
    out = tmp_path / "again"
    res = build([tmp_path], out)
    assert sorted(f.name for f in res["files"]) == ["frontier.json", "frontier.md"]


def test_energy_column_with_interval_and_second_axis(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from agent_replay.analysis.frontier import build
    from agent_replay.analysis.points import POINT_FIELDS
    from agent_replay.replay.sweep.index import read_index, write_index

    assert {"j_per_output_token", "output_tokens_per_s_per_kw"} <= {k for k, _ in POINT_FIELDS}
    energy = {1: (0.30, 0.34, 0.32), 4: (0.20, 0.22, 0.24)}  # J per output token, 3 repeats
    rows = [_row("a", p, r, tps, thr) | {"order": r * 2 + p, "j_per_output_token": energy[p][r],
                                          "output_tokens_per_s_per_kw": 1000 / energy[p][r]}
            for r in range(3) for p, tps, thr in ((1, 50, 100), (4, 30, 300))]
    rows.append(_row("b", 1, 0, 45, 90) | {"order": 9})  # a target without telemetry
    write_index(tmp_path, rows)
    back = {(r["target"], r["point"], r["repeat"]): r for r in read_index(tmp_path)}
    assert back[("a", 4.0, 2)]["j_per_output_token"] == 0.24
    assert back[("b", 1.0, 0)]["j_per_output_token"] is None
    assert "j_per_output_token" in (tmp_path / "index.csv").read_text().splitlines()[0]
    res = build([tmp_path])
    md = res["markdown"]
    head = next(ln for ln in md.splitlines() if ln.startswith("| sweep"))
    col = head.split(" | ").index("J/output token")
    cells = {(ln.split(" | ")[1], ln.split(" | ")[2]): ln.split(" | ")[col]
             for ln in md.splitlines() if ln.startswith("|  | ")}
    # point 1: mean 0.32, sd 0.02, half width 4.303 * 0.02 / sqrt(3) = 0.0497
    assert cells[("a", "1")] == "0.320 [0.270, 0.370]"
    assert cells[("a", "4")] == "0.220 [0.170, 0.270]"
    assert cells[("b", "1")] == "-"
    data = json.loads((tmp_path / "frontier.json").read_text())
    a1 = next(p for p in data["points"] if p["target"] == "a" and p["point"] == 1)
    assert a1["mean_ci"]["j_per_output_token"]["estimate"] == pytest.approx(0.32)
    assert a1["mean_ci"]["output_tokens_per_s_per_kw"]["estimate"] == pytest.approx(
        np.mean([1000 / 0.30, 1000 / 0.34, 1000 / 0.32]))
    png = tmp_path / "frontier-p90_tps.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    # without the energy figures the column goes away
    plain = to_markdown(points([{k: v for k, v in r.items() if "per_output_token" not in k
                                 and "per_kw" not in k} for r in rows]), "load")
    assert "J/output token" not in plain
