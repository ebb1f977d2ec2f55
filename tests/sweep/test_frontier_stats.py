"""The frontier is the non-dominated set; run-level intervals and verdicts."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from agent_replay.analysis.frontier import build, pareto_mask, points, to_markdown
from agent_replay.analysis.replicates import (
    adjust,
    holm,
    mean_ci,
    ratio_ci,
    t975,
    t_two_sided_p,
    verdict,
)


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
    assert pareto_mask([(1, 10), (10, 1), (5, 5), (4, 4), (5, 5)]) == [
        True,
        True,
        True,
        False,
        True,
    ]


def test_mean_ci_is_geometric_with_a_log_scale_interval_hand_computed() -> None:
    # logs of (e^1, e^2, e^3): mean 2, sd 1, se 1/sqrt(3), t(2) = 4.303
    ci = mean_ci([math.e, math.e**2, math.e**3])
    half = 4.303 / math.sqrt(3)
    assert ci.estimate == pytest.approx(math.e**2)
    assert (ci.low, ci.high) == (
        pytest.approx(math.exp(2 - half)),
        pytest.approx(math.exp(2 + half)),
    )
    # a spread that took the arithmetic interval below zero (TTFT P99 of 50, 60, 430 ms)
    # stays positive on the log scale
    wide = mean_ci([50.0, 60.0, 430.0])
    assert (
        wide.low is not None
        and wide.low > 0
        and wide.estimate == pytest.approx((50 * 60 * 430) ** (1 / 3))
    )
    one = mean_ci([5.0])
    assert one.estimate == 5.0 and one.low is None
    # not all positive: the arithmetic mean and interval (mean 0, sd 2)
    flat = mean_ci([-2.0, 0.0, 2.0])
    assert flat.estimate == 0.0 and flat.high == pytest.approx(4.303 * 2 / math.sqrt(3))


def test_t_p_value_matches_closed_forms() -> None:
    for t in (0.5, 1.0, 3.4641, 12.706):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-9)
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(2.042, 30) == pytest.approx(0.05, abs=2e-4)


def test_ratio_ci_on_log_ratios_hand_computed() -> None:
    # per-pair ratios e^0.1, e^0.2, e^0.3: log mean 0.2, sd 0.1, se 0.1/sqrt(3)
    a = [100.0, 200.0, 50.0]
    b = [100.0 * math.exp(0.1), 200.0 * math.exp(0.2), 50.0 * math.exp(0.3)]
    ci = ratio_ci(a, b)
    half = 4.303 * 0.1 / math.sqrt(3)
    assert ci.estimate == pytest.approx(math.exp(0.2) - 1)
    assert ci.low == pytest.approx(math.exp(0.2 - half) - 1)  # -4.7%
    assert ci.high == pytest.approx(math.exp(0.2 + half) - 1)  # +56.6%
    t = 0.2 / (0.1 / math.sqrt(3))
    assert ci.p == pytest.approx(1 - t / math.sqrt(2 + t * t))  # df 2: 0.0742
    assert not ci.excludes_zero and "inconclusive" in verdict("P90 TPS", ci)
    # a statistic and its reciprocal: the same test, mirrored (P90 TPS = 1 / P90 TPOT)
    inv = ratio_ci([1 / x for x in a], [1 / x for x in b])
    assert inv.p == pytest.approx(ci.p)
    assert math.log1p(inv.estimate or 0) == pytest.approx(-math.log1p(ci.estimate or 0))
    assert math.log1p(inv.low or 0) == pytest.approx(-math.log1p(ci.high or 0))
    # a large relative spread never gives a bound at or below -100%
    big = ratio_ci([100.0, 100.0, 100.0], [10.0, 90.0, 200.0])
    assert big.low is not None and big.low > -1
    assert "inconclusive" in verdict("x", ratio_ci([1.0], [2.0]))


def test_holm_hand_computed() -> None:
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, 1 x 0.04 -> max(0.06, 0.04)
    assert holm([0.01, 0.04, 0.03]) == [
        pytest.approx(0.03),
        pytest.approx(0.06),
        pytest.approx(0.06),
    ]
    assert holm([0.5, None, 0.001]) == [pytest.approx(0.5), None, pytest.approx(0.002)]
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1 (2 x 0.6), then monotone
    assert t975(2) == pytest.approx(4.303) and t975(1000) == pytest.approx(1.96, abs=0.01)


def test_verdict_uses_the_holm_adjusted_p_value() -> None:
    # log ratios 0.08, 0.10, 0.12: mean 0.1, sd 0.02, t = 0.1 / (0.02 / sqrt 3) = 8.66,
    # df 2: p = 1 - t / sqrt(2 + t^2) = 0.0131
    a = [100.0, 100.0, 100.0]
    b = [100 * math.exp(0.08), 100 * math.exp(0.10), 100 * math.exp(0.12)]
    (alone,) = adjust([ratio_ci(a, b)])
    t = 0.1 / (0.02 / math.sqrt(3))
    assert alone.p == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert alone.p_adjusted == alone.p and "better" in verdict("P90 TPS", alone)
    # the same comparison among 9 others with p = 1: Holm multiplies its p by 10 -> 0.131
    nothing = ratio_ci(a, [100.0, 101.0, 99.0])
    crowd = adjust([ratio_ci(a, b)] + [nothing] * 9)
    assert crowd[0].p_adjusted == pytest.approx(10 * (alone.p or 0))
    assert "inconclusive after the Holm correction" in verdict("P90 TPS", crowd[0])


def test_interval_of_identical_targets_contains_zero_in_95_percent() -> None:
    # two identical arms with run-to-run noise: the 95% paired interval covers 0 in ~95% of
    # trials (a test that the interval is not too narrow)
    rng = np.random.default_rng(11)
    hits = sum(
        not ratio_ci(list(x), list(y)).excludes_zero
        for x, y in (rng.lognormal(np.log(100), 0.15, size=(2, 3)) for _ in range(2000))
    )
    assert 0.93 <= hits / 2000 <= 0.97


def _row(
    target: str, point: float, rep: int, tps: float, thr: float, status: str = "complete"
) -> dict:
    return {
        "phase": "sweep",
        "target": target,
        "point": point,
        "repeat": rep,
        "status": status,
        "reason": None if status == "complete" else "boom",
        "order": rep,
        "p90_tps": tps,
        "output_tps_per_gpu": thr,
        "north_star": tps / 2,
        "agentx_interactivity": tps / 1.5,
        "total_tps_per_gpu": thr * 3,
    }


def test_frontier_table_marks_and_keeps_failed_points() -> None:
    rows = [
        _row("a", p, r, tps, thr)
        for r in range(3)
        for p, tps, thr in ((1, 50, 100), (2, 40, 180), (4, 30, 170), (8, 20, 300))
    ]
    rows.append(_row("a", 16, 0, 0, 0, status="unreachable"))
    pts = points(rows)
    md = to_markdown(pts, "concurrent_sessions")
    lines = {ln.split(" | ")[2]: ln for ln in md.splitlines() if ln.startswith("|  | a")}
    assert "*" in lines["1"] and "*" in lines["2"] and "*" in lines["8"]
    assert "*" not in lines["4"]  # (30, 170) is beaten by (40, 180)
    assert "r0 unreachable: boom" in lines["16"]
    assert set(itertools.chain.from_iterable(p.on_frontier for p in pts)) == {
        "p90_tps:output_tps_per_gpu",
        "north_star:output_tps_per_gpu",
    }


def test_build_writes_tables_and_plots_and_skips_plots_without_matplotlib(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
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
    assert names == [
        "frontier-agentx_interactivity-total.png",
        "frontier-agentx_interactivity.png",
        "frontier-north_star-total.png",
        "frontier-north_star.png",
        "frontier-p90_tps-total.png",
        "frontier-p90_tps.png",
        "frontier.json",
        "frontier.md",
    ]
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
    rows = [
        _row("a", p, r, tps, thr)
        | {
            "order": r * 2 + p,
            "j_per_output_token": energy[p][r],
            "output_tokens_per_s_per_kw": 1000 / energy[p][r],
        }
        for r in range(3)
        for p, tps, thr in ((1, 50, 100), (4, 30, 300))
    ]
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
    cells = {
        (ln.split(" | ")[1], ln.split(" | ")[2]): ln.split(" | ")[col]
        for ln in md.splitlines()
        if ln.startswith("|  | ")
    }
    # point 1: 0.30, 0.34, 0.32: the geometric mean with a t interval on the logs
    logs = np.log([0.30, 0.34, 0.32])
    half = 4.303 * logs.std(ddof=1) / math.sqrt(3)
    g = math.exp(logs.mean())
    assert (
        cells[("a", "1")]
        == f"{g:.3f} [{math.exp(logs.mean() - half):.3f}, {math.exp(logs.mean() + half):.3f}]"
    )
    assert cells[("a", "1")] == "0.320 [0.274, 0.373]"
    assert cells[("b", "1")] == "-"
    data = json.loads((tmp_path / "frontier.json").read_text())
    a1 = next(p for p in data["points"] if p["target"] == "a" and p["point"] == 1)
    assert a1["mean_ci"]["j_per_output_token"]["estimate"] == pytest.approx(g)
    assert a1["mean_ci"]["output_tokens_per_s_per_kw"]["estimate"] == pytest.approx(1000 / g)
    png = tmp_path / "frontier-p90_tps.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    # without the energy figures the column goes away
    plain = to_markdown(
        points(
            [
                {k: v for k, v in r.items() if "per_output_token" not in k and "per_kw" not in k}
                for r in rows
            ]
        ),
        "load",
    )
    assert "J/output token" not in plain


PAIR = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu/2026-12-01-h200x2-sweep/pair"


def test_committed_h200_sweep_frontier_flags_and_dominated_point(tmp_path: Path) -> None:
    """The H200 sweep of two vLLM deployments: dedicated-decode at 2 sessions is beaten on
    both axes by its own 8-session point, so it is not on the frontier; the runs whose
    warm-up never became steady and the TTFT P99 of a few dozen requests are flagged."""
    from agent_replay.replay.sweep.index import read_index

    res = build([PAIR], tmp_path)
    pts = {(p.target, p.point): p for p in res["points"]}
    d2, d8 = pts[("dedicated-decode", 2.0)], pts[("dedicated-decode", 8.0)]
    for k in ("p90_tps", "output_tps_per_gpu"):
        assert (d8.mean(k) or 0) > (d2.mean(k) or 0)
    assert d2.on_frontier["p90_tps:output_tps_per_gpu"] is False
    rows = read_index(PAIR)
    unsteady = sum(1 for r in rows if r.get("warmup_steady") is False)
    assert unsteady == 7 and len(rows) == 18
    md = res["markdown"]
    assert f"Warm-up not reached: {unsteady} of 18 runs" in md
    assert md.count("warm-up not steady") == unsteady
    line2 = next(ln for ln in md.splitlines() if ln.startswith("|  | dedicated-decode | 2 |"))
    ttft_cell = line2.split(" | ")[8]
    assert ttft_cell.split(" ")[0].endswith("*")  # P99 of < 100 requests
    assert all(float(c.strip("[],*")) > 0 for c in ttft_cell.split(" ")[1:])  # never below 0
    assert "Holm-corrected across the 9 comparisons" in md
    assert "it is not the server's capacity" in md  # session timing: offered load
    assert "server settings not recorded for standard, dedicated-decode" in md
    data = json.loads((tmp_path / "frontier.json").read_text())
    assert sum(len(p["warmup_not_steady"]) for p in data["points"]) == unsteady


def test_a_run_whose_warm_up_never_became_steady_says_so_in_its_report() -> None:
    from agent_replay.analysis.report import build_report

    runs = PAIR / "runs" / "standard" / "concurrent_sessions=2"
    rep = build_report(runs / "r0")  # r0.warmup/warmup.json: steady false, 4 bursts
    assert rep.cold_start is not None and rep.cold_start.startswith(
        "warm-up not reached: 4 warm-up bursts never had two in a row with median TPOT within "
        "10% (1.71, 2.30, 1.87, 1.60 ms)"
    )
    assert any("warm-up not reached" in w for w in rep.warnings)
    assert build_report(runs / "r1").cold_start is None  # steady after 2 bursts


def test_an_agentx_run_warmed_by_its_own_warm_up_phase_is_not_called_cold() -> None:
    """A committed AgentX run on the H100 (no --warmup window, no sweep warm-up replay): its
    warm-up phase sent the warm-up of every live stream, so the server was warm; the same
    run counted without those rows would be called cold."""
    from agent_replay.analysis.coldstart import cold_start
    from agent_replay.analysis.report import build_report

    run = (
        Path(__file__).resolve().parents[2]
        / "benchmarks"
        / "results"
        / "gpu"
        / "2026-12-06-h100-agentx-solo"
        / "results"
        / "runs"
        / "standard"
        / "c4"
        / "r1"
    )
    rep = build_report(run)
    assert rep.stats.requests["warmup"] > 0 and rep.cold_start is None
    assert not any("cold start" in w for w in rep.warnings)
    assert (cold_start(rep.meta, rep.stats.per_request, run) or "").startswith("no warm-up")


def test_frontier_lists_the_settings_in_which_the_targets_differ(tmp_path: Path) -> None:
    from agent_replay.replay.sweep.index import write_index

    rows = [
        _row(t, 2, r, 50 + r, 100) | {"path": f"runs/{t}/r{r}"}
        for t in ("std", "mtp")
        for r in range(2)
    ]
    argv = {
        "std": ["vllm", "serve", "M", "--port", "1", "--max-num-seqs", "64"],
        "mtp": [
            "vllm",
            "serve",
            "M",
            "--port",
            "2",
            "--max-num-seqs",
            "64",
            "--speculative-config",
            '{"method":"mtp"}',
        ],
    }
    for r in rows:
        d = tmp_path / r["path"]
        d.mkdir(parents=True)
        (d / "run.json").write_text(
            json.dumps(
                {"launch": {"kind": "launch", "profile": r["target"], "command": argv[r["target"]]}}
            )
        )
    write_index(tmp_path, rows)
    (tmp_path / "sweep.json").write_text(
        json.dumps({"axis": "concurrent_sessions", "targets": [{"name": "std"}, {"name": "mtp"}]})
    )
    md = build([tmp_path])["markdown"]
    assert (
        "- mtp vs std: the servers differ in 2 settings: --speculative-config (unset) vs "
        '{"method":"mtp"}; profile std vs mtp'
    ) in md
    assert "mtp vs std at 2, p90_tps" in md  # the file's first target is the base
