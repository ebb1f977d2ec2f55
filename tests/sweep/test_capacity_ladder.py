"""Capacity from a ladder of single runs: the bracket, the verdicts from each figure's
interval, the crossing, and a run's figure with its bootstrap interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_replay.replay.sweep.capacity import (
    Estimate,
    crossing,
    figure_estimate,
    ladder_capacity,
    margin,
    parse_slo,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo/results/runs/standard/c8/r1"


def test_margin_and_verdict_by_hand() -> None:
    tps, ttft = parse_slo("p90_tps>=100,ttft_p90<=2s")
    # >=: value - bound; the pessimistic margin is the low bound's
    assert margin(tps, 110.0, 95.0, 130.0) == (10.0, -5.0, 30.0)
    # <=: bound - value; 2 s = 2000 ms
    assert margin(ttft, 1500.0, 1000.0, 2500.0) == (500.0, -500.0, 1000.0)
    assert margin(tps, 110.0, None, None) is None
    assert verdict([(tps, (101.0, 120.0))]) == "meets"
    assert verdict([(tps, (95.0, 120.0))]) == "uncertain"
    assert verdict([(tps, (80.0, 99.0))]) == "fails"
    assert verdict([(tps, (None, None))]) == "uncertain"
    assert verdict([(tps, (101.0, 120.0)), (ttft, (2100.0, 3000.0))]) == "fails"
    assert verdict([(tps, None)]) == "fails"


def test_crossing_by_hand() -> None:
    # margins +20 at 4 and -20 at 6: crossed at 5; pessimistic +10 and -30: 4 + 2 x 10 / 40
    assert crossing([(20.0, 10.0, 30.0)], [(-20.0, -30.0, -10.0)], 4, 6) == pytest.approx(
        (5.0, 4.5, 4 + 2 * 30 / 40)
    )
    assert crossing([None], [(-1.0, -2.0, 0.0)], 4, 6) is None


def test_ladder_capacity_by_hand() -> None:
    slo = parse_slo("p90_tps>=100")
    pts = {
        1.0: {"p90_tps": Estimate(160.0, 150.0, 170.0)},
        2.0: {"p90_tps": Estimate(130.0, 110.0, 150.0)},
        4.0: {"p90_tps": Estimate(110.0, 90.0, 125.0)},
        6.0: {"p90_tps": Estimate(90.0, 70.0, 95.0)},
        8.0: {"p90_tps": Estimate(70.0, None, None)},
    }
    cap = ladder_capacity("std", 1, pts, slo)
    assert (cap.capacity, cap.first_fail) == (4.0, 6.0)
    assert [p.sure for p in cap.probes] == ["meets", "meets", "uncertain", "fails", "uncertain"]
    assert cap.spread == (2.0, 6.0)  # surely meets up to 2, surely fails from 6
    # margins +10 [-10, +25] at 4 and -10 [-30, -5] at 6
    x, lo, hi = cap.crossing or (0.0, 0.0, 0.0)
    assert x == pytest.approx(5.0)
    assert lo == pytest.approx(4 + 2 * -10 / (-10 + 30))  # 3.0: one bracket width below 4 at most
    assert hi == pytest.approx(4 + 2 * 25 / (25 + 5))
    assert ladder_capacity("std", 1, {1.0: pts[8.0]}, slo).capacity is None
    top = ladder_capacity("std", 1, {1.0: pts[1.0], 2.0: pts[2.0]}, slo)
    assert (top.capacity, top.first_fail, top.crossing) == (2.0, None, None)


@pytest.mark.skipif(not RUN.is_dir(), reason="the committed GPU run is absent")
def test_figure_estimate_on_a_gpu_run() -> None:
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report

    report = build_report(RUN)
    row = point_metrics(report, 1)
    for key in ("p90_tps", "north_star", "ttft_p90_ms"):
        e = figure_estimate(report, key)
        assert e.value == row[key]
        assert e.low is not None and e.high is not None
        assert e.low <= e.value <= e.high and e.low < e.high
    assert figure_estimate(report, "p90_tps") == figure_estimate(report, "p90_tps")  # seeded


@pytest.mark.skipif(not RUN.is_dir(), reason="the committed GPU run is absent")
def test_figure_estimate_is_the_bootstrap_of_the_percentile() -> None:
    import numpy as np

    from agent_replay.analysis.compare import block_bootstrap_percentile
    from agent_replay.analysis.report import build_report

    report = build_report(RUN)
    t = report.stats.per_request
    ok = np.asarray(t.column("ok").to_pylist(), dtype=bool)
    tpot = np.asarray(t.column("tpot").to_pylist(), dtype=np.float64)[ok]
    order = np.asarray(t.column("intended_ns").to_pylist(), dtype=np.float64)[ok]
    keep = ~np.isnan(tpot)
    boots = block_bootstrap_percentile(
        tpot[keep], order[keep], 90.0, 1000, np.random.default_rng(0)
    )
    # P90 TPS is a nearest-rank figure: its interval is 1 / the resampled P90 TPOT
    e = figure_estimate(report, "p90_tps")
    lo, hi = np.percentile(1e9 / boots, [2.5, 97.5])
    assert (e.low, e.high) == (pytest.approx(lo), pytest.approx(hi))
