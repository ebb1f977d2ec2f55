"""docs/gpu.md against the committed H100 AgentX data (the co-resident servers and the solo
ladders), and the statistics its tables use."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx"
SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
REPEATS = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats"


doc = load_script("benchmarks/gpu/agentx_doc.py")
solo = doc.ladders  # benchmarks/gpu/agentx_solo.py, as the doc script imported it
runs = sys.modules["agentx_runs"]  # benchmarks/gpu/agentx_runs.py, likewise


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
    a, b = doc.log_ratio_effects(
        [([1.0, 1.0, 1.0], [2.0, 2.1, 1.9]), ([1.0, 1.0, 1.0], [1.0, 1.5, 0.8])]
    )
    assert a.level == pytest.approx(0.975) and b.level == pytest.approx(0.95)
    assert a.p_holm == pytest.approx(2 * a.p)


def test_nearest_rank() -> None:
    assert doc.nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert doc.nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 90) == 5.0


def test_doc_holds_every_figure_of_the_data() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    assert doc.missing(text) == []
    assert doc.readme_table() in (ROOT / "README.md").read_text()


def test_a_changed_number_fails() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    blocks = doc.blocks()
    row = blocks["effects table"].splitlines()[2]
    assert row in text
    assert doc.missing(text.replace(row, row.replace("%", "1%", 1))) == ["effects table"]
    sentence = blocks["ratio sentence"]
    assert sentence in " ".join(text.split())
    changed = text.replace("beside the seeds'", "beside the seeds' 1")
    assert doc.missing(changed) == ["ratio sentence"]


def test_run_figures_are_the_reports() -> None:
    from agent_replay.analysis.render import report_dict
    from agent_replay.analysis.report import build_report

    folder = doc.run_dir("standard", 3, 1, RUN)
    rep = report_dict(build_report(folder))
    f = doc.figures(folder)
    assert f.p90_tps == rep["headline"]["p90_tps"] and f.requests == rep["requests"]["counted"]
    assert f.north_star == pytest.approx(rep["speeds_tok_s"]["north_star"])
    assert f.total_per_gpu == rep["throughput"]["total_tokens_per_s_per_gpu"]


def test_no_requested_setting_differs_on_the_servers_that_ran() -> None:
    """The launcher's check (engines/vllm/resolved.py) on each server that ran the repeats:
    nothing differs, and the settings the recipe is about are reported in effect."""
    for name in doc.SERVER.values():
        checks = runs.setting_checks(name, RUN)
        assert checks and [c.flag for c in checks if c.status == "differs"] == []
    ded = {c.flag: c.status for c in runs.setting_checks("ded", RUN)}
    for flag in (
        "--performance-mode",
        "--compilation-config.cudagraph_mode",
        "--compilation-config.cudagraph_capture_sizes",
        "--compilation-config.mode",
        "--speculative-config.num_speculative_tokens",
        "--kv-cache-memory-bytes",
    ):
        assert ded[flag] == "in effect", flag


def test_synthetic_acceptance_shows_in_the_servers_counters() -> None:
    acc = steps = 0.0
    for r in (1, 2, 3):
        a, n = doc.acceptance_length(doc.run_dir("mtp", 1, r, RUN))
        acc, steps = acc + a, steps + n
    assert abs(1 + acc / steps - 2.49) < 0.05


def test_intervals_leave_out_zero_exactly_where_holm_rejects() -> None:
    for e in doc.effects(RUN).values():
        assert (e.p_holm < doc.ALPHA) == (e.low > 0 or e.high < 0)


def test_each_repeat_replayed_the_same_seed_on_every_server() -> None:
    import json

    for r in (1, 2, 3):
        seeds = {
            json.loads((doc.run_dir(p, 1, r, RUN) / "run.json").read_text())["salt"]
            for p in doc.PROFILES
        }
        assert seeds == {42 + r}


def test_the_model_is_over_ten_billion_parameters_and_24_layers() -> None:
    import json

    from agent_replay.engines.vllm.tiny_model import deepseek_parameters

    cfg = json.loads((RUN / "results/model-config.json").read_text())
    assert cfg["num_hidden_layers"] >= 24 and deepseek_parameters(cfg)["main"] > 10e9


def test_each_empty_run_spent_its_duration_in_the_warm_up() -> None:
    for folder in sorted((RUN / "results/runs").glob("*/c*/r1")):
        f = doc.figures(folder)
        if f.requests == 0:
            assert doc.warmup_span_s(folder) > f.duration_s, folder


# ---- the solo ladders ---------------------------------------------------------------------


def _hand_points(p90: dict[int, float | list[float]]) -> list:
    """Frontier points of target x: each lane count's runs (one value: one run)."""
    from agent_replay.analysis.frontier import points

    return points(
        [
            {
                "phase": "sweep",
                "target": "x",
                "point": float(c),
                "repeat": k,
                "status": "complete",
                "p90_tps": v,
                "tpot_n": 50,
            }
            for c, vs in p90.items()
            for k, v in enumerate(vs if isinstance(vs, list) else [vs], start=1)
        ]
    )


def test_point_aggregate_by_hand() -> None:
    # 100, 200, 400: mean log = ln 200, sd of the logs = ln 2, t(0.975, 2) = 4.303 (the table)
    a = solo.aggregate([100.0, 200.0, 400.0])
    half = 4.303 * math.log(2) / math.sqrt(3)
    assert (a.estimate, a.n) == (pytest.approx(200.0), 3)
    assert a.low == pytest.approx(200 * math.exp(-half), rel=1e-5)
    assert a.high == pytest.approx(200 * math.exp(half), rel=1e-5)
    # two runs: 1 degree of freedom, t = 12.706; sd of (ln 100, ln 400) = ln 4 / sqrt 2
    b = solo.aggregate([100.0, 400.0])
    half = 12.706 * (math.log(4) / math.sqrt(2)) / math.sqrt(2)
    assert b.estimate == pytest.approx(200.0)
    assert b.low == pytest.approx(200 * math.exp(-half), rel=1e-4)
    # one run (a run without the figure counts for none): the value, no interval
    one = solo.aggregate([150.0, None])
    assert (one.estimate, one.low, one.high, one.n) == (150.0, None, None, 1)
    assert solo._agg(one) == "150.0" and solo._agg(one, 1, "*") == "150.0*"
    assert solo._agg(solo.Aggregate(200.0, 35.7, 1119.0, 3), 1, "*") == "200.0* [35.7, 1,119.0]"


def test_point_runs_hold_the_repeats_as_more_runs() -> None:
    got = solo.point_runs(SOLO, (REPEATS,))
    assert len(got) == 15
    n = {k: [r for r, _ in v] for k, v in got.items() if len(v) > 1}
    assert n == {
        ("standard", 4): [1, 2],
        ("mtp", 4): [1, 2, 3],
        ("mtp", 6): [1, 2, 3],
        ("dedicated-decode", 4): [1, 2, 3],
        ("dedicated-decode", 6): [1, 2, 3],
    }
    assert got[("mtp", 6)][2][1] == REPEATS / "results/runs/mtp/c6/r3"
    assert solo.point_runs(SOLO, ()) == {k: v[:1] for k, v in got.items()}
    with pytest.raises(ValueError, match="r2 of standard at 4 lanes is also"):
        solo.point_runs(SOLO, (REPEATS, REPEATS))


def test_capacity_by_hand() -> None:
    pts = _hand_points({1: 250.0, 2: 180.0, 4: 210.0, 8: 90.0})
    cap = solo.capacity_of(pts, "x", 200)
    assert (cap.meets, cap.fails, cap.later, cap.few) == (1, (2, 180.0), (4,), False)
    assert solo._capacity_cell(cap) == "1; meets again at 4"
    # one run per point: no interval, so no verdict is sure
    assert (cap.last.verdict, cap.first_fail.verdict, cap.sure) == ("uncertain",) * 2 + (False,)
    assert solo._end_cell(cap.first_fail) == "2: 180.0 (1 run), uncertain"
    assert solo._sure_cell(cap) == "uncertain: no tested count is sure"
    assert solo.capacity_of(pts, "x", 50).fails is None
    assert solo._capacity_cell(solo.capacity_of(pts, "x", 50)) == "8 or more (the most tested)"
    assert solo.capacity_of(pts, "x", 300).meets == 0
    assert solo._capacity_cell(solo.capacity_of(pts, "x", 300)) == "none"
    # a P90 over fewer than 10 requests in a deciding run is marked
    few = _hand_points({1: 250.0, 2: 180.0})
    for p in few:
        p.runs[0]["tpot_n"] = 3
    assert solo._capacity_cell(solo.capacity_of(few, "x", 200)) == "1*"


def test_capacity_over_repeats_by_hand() -> None:
    # 4 lanes: mean 185.0 with a narrow interval, wholly below 200: surely fails; 2 lanes
    # surely meets: the bracket (2, 4) is sure
    pts = _hand_points({1: 250.0, 2: [230.0, 220.0, 225.0], 4: [190.0, 185.0, 180.0], 8: 100.0})
    cap = solo.capacity_of(pts, "x", 200)
    gm = (190.0 * 185.0 * 180.0) ** (1 / 3)
    assert (cap.meets, cap.fails[0]) == (2, 4) and cap.fails[1] == pytest.approx(gm)
    assert (cap.last.verdict, cap.first_fail.verdict) == ("meets", "fails")
    assert cap.spread == (2.0, 4.0) and cap.sure and solo._sure_cell(cap) == "sure"
    assert solo._end_cell(cap.last).endswith("(3 runs), surely meets")
    # 4 lanes: 210, 190, 180: mean below 200 but its interval holds 200: uncertain, and the
    # one run at 8 cannot surely fail, so the spread reaches past the ladder
    pts = _hand_points({1: 250.0, 2: [230.0, 220.0, 225.0], 4: [210.0, 190.0, 180.0], 8: 100.0})
    cap = solo.capacity_of(pts, "x", 200)
    assert (cap.meets, cap.fails[0], cap.first_fail.verdict) == (2, 4, "uncertain")
    assert cap.spread == (2.0, None) and not cap.sure
    assert solo._sure_cell(cap) == "uncertain: surely 2 or more"
    # the verdicts are --find-capacity's own
    from agent_replay.replay.sweep.capacity import parse_slo, surely

    four = next(p for p in pts if p.point == 4)
    assert cap.first_fail.verdict == surely(four.runs, parse_slo("p90_tps>=200"))


def test_a_changed_solo_number_fails() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    blocks = doc.blocks()
    for name in ("solo ladder table", "capacity table", "solo runs table"):
        row = blocks[name].splitlines()[-1]
        assert row in text
        assert doc.missing(text.replace(row, row.replace("|", "| 1", 2)[:-1] + "|")) == [name]
    sentence = blocks["ladder sentence"]
    assert sentence in " ".join(text.split())
    assert doc.missing(text.replace("of its runs): standard", "of its runs): standard 1")) == [
        "ladder sentence"
    ]


def test_solo_runs_ran_as_the_doc_says() -> None:
    """The options, order and outcome of the solo runs that docs/gpu.md states in words."""
    import json

    folders = solo.solo_folders(SOLO)
    assert [(p, c) for p, c, _ in folders] == [
        (p, c) for p in doc.PROFILES for c in (1, 2, 4, 6, 8)
    ]
    for _, c, folder in folders:
        meta = json.loads((folder / "run.json").read_text())
        opts = meta["options"]
        assert meta["status"] == "ok" and opts["concurrency"] == c
        assert (opts["duration_s"], opts["agentx"]["warmup_requests"]) == (35.0, 1)
        assert (opts["agentx"]["seed"], opts["salt"], opts["gpus"]) == (42, 42, 1)
        assert meta["provenance"]["source"]["code_version"] == "ade4657-dirty"
        f = doc.figures(folder)
        assert f.preemptions == 0 and f.kv_peak is not None and f.kv_peak < 0.5
    env = (SOLO / "logs/env.txt").read_text().splitlines()
    assert env.count("2620e3d") == 3  # .commit, written once per phase
    order = [n for n, _, _ in solo.steps(SOLO) if n.endswith("-mtp")]
    assert order == ["c1-r1-mtp", "c2-r1-mtp", "c4-r1-mtp", "c8-r1-mtp", "c6-r1-mtp"]
    # one model for both setups, one kind of card for every run
    assert (RUN / "results/model-config.json").read_bytes() == (
        SOLO / "results/model-config.json"
    ).read_bytes()
    assert solo.cards(RUN) == solo.cards(SOLO) == solo.cards(REPEATS) and len(solo.cards(SOLO)) == 1
    assert solo.cards(SOLO)[0].startswith("NVIDIA H100 80GB HBM3")


def test_repeats_ran_as_the_doc_says() -> None:
    """The repeats: the ladder's options but the seed (41 + r), every run ok, the order on
    each fresh server, and no preemption or KV cache past half full in any solo run."""
    import json

    for (_, c), got in solo.point_runs(SOLO, (REPEATS,)).items():
        for k, folder in got:
            meta = json.loads((folder / "run.json").read_text())
            opts = meta["options"]
            assert meta["status"] == "ok" and opts["concurrency"] == c
            assert (opts["duration_s"], opts["agentx"]["warmup_requests"]) == (35.0, 1)
            assert (opts["agentx"]["seed"], opts["salt"], opts["gpus"]) == (41 + k, 41 + k, 1)
            if k > 1:
                assert meta["provenance"]["source"]["code_version"] == "5cb94b4-dirty"
            f = doc.figures(folder)
            assert f.preemptions == 0 and f.kv_peak is not None and f.kv_peak < 0.5
    for short in ("mtp", "ded"):
        order = [n for n, _, _ in solo.steps(REPEATS) if n.startswith("c") and n.endswith(short)]
        assert order == [f"c4-r2-{short}", f"c6-r2-{short}", f"c4-r3-{short}", f"c6-r3-{short}"]
    assert [n for n, _, _ in solo.steps(REPEATS) if n.endswith("-std")] == ["c4-r2-std"]
    env = (REPEATS / "logs/env.txt").read_text().splitlines()
    assert env.count("5cb94b45ef63a3ef4dd43c3cc54bf9c0f6c2a9a6") == 3  # .commit, once a phase
    assert (REPEATS / "results/model-config.json").read_bytes() == (
        SOLO / "results/model-config.json"
    ).read_bytes()


def test_the_repeats_reading_holds() -> None:
    """The sentences under the table of the repeated points' runs."""
    got = solo.point_runs(SOLO, (REPEATS,))
    spread = {
        k: max(f.p90_tps for f in fs) / min(f.p90_tps for f in fs)
        for k, v in got.items()
        if len(v) > 1
        for fs in [[doc.figures(f) for _, f in v]]
    }
    assert max(spread, key=lambda k: spread[k]) == ("mtp", 6)
    assert round(spread[("mtp", 6)] - 1, 2) == 0.10  # "up to 10%"
    ttft = {(k, r): doc.figures(f).ttft_p90_ms for k, v in got.items() if len(v) > 1 for r, f in v}
    for prof in doc.PROFILES:  # at 4 lanes the first run on a fresh server is the slowest
        mine = {r: t for (k, r), t in ttft.items() if k == (prof, 4)}
        assert max(mine, key=lambda r: mine[r]) == 2
    slow = {("mtp", 4), ("dedicated-decode", 4)}
    assert all(ttft[(k, 2)] > 2000 for k in slow)
    rest = [t for (k, r), t in ttft.items() if not (k in slow and r == 2)]
    assert (round(min(rest) / 1000, 1), round(max(rest) / 1000, 1)) == (0.3, 0.7)  # seconds


def test_the_ladder_reading_holds() -> None:
    """The sentences of docs/gpu.md's solo ladder that read the table in words (each point
    the mean of its runs)."""
    pts = {(p.profile, p.lanes): p for p in solo.ladder_points(SOLO, (REPEATS,))}
    p90 = {k: p.agg("p90_tps").estimate for k, p in pts.items()}
    total = {k: p.agg("total_per_gpu").estimate for k, p in pts.items()}
    lanes = (1, 2, 4, 6, 8)
    std = [p90[("standard", c)] for c in lanes]
    assert all(a > b for a, b in itertools.pairwise(std))  # loses speed with every lane
    assert max(doc.PROFILES, key=lambda p: p90[(p, 1)]) == "mtp"
    for c in lanes:  # mtp has the highest AgentX tok/s per GPU at every lane count
        assert max(doc.PROFILES, key=lambda p: total[(p, c)]) == "mtp"
    for c in (4, 6):  # where both have three runs, their intervals overlap
        a, b = pts[("mtp", c)], pts[("dedicated-decode", c)]
        assert len(a.runs) == len(b.runs) == 3
        for key in ("p90_tps", "total_per_gpu"):
            x, y = a.agg(key), b.agg(key)
            assert x.low < y.high and y.low < x.high, (c, key)
    kept = {p: p90[(p, 8)] / p90[(p, 1)] for p in doc.PROFILES}
    assert max(kept, key=lambda p: kept[p]) == "dedicated-decode"
    assert p90[("dedicated-decode", 1)] < p90[("mtp", 1)]
    assert p90[("dedicated-decode", 8)] > p90[("mtp", 8)]
    assert {k for k, p in pts.items() if len(p.runs) == 1 and k[1] in (1, 2, 8)} == {
        (p, c) for p in doc.PROFILES for c in (1, 2, 8)
    }


def test_the_capacity_reading_holds() -> None:
    """The sentences under the capacity table."""
    pts = solo.solo_points(SOLO, (REPEATS,))
    caps = {(p, f): solo.capacity_of(pts, p, f) for p in doc.PROFILES for f in solo.THRESHOLDS}
    assert [k for k, c in caps.items() if c.sure] == [("dedicated-decode", 200)]
    ded = caps[("dedicated-decode", 200)]
    assert (ded.meets, ded.fails[0], ded.last.p90.n, ded.first_fail.p90.n) == (4, 6, 3, 3)
    mtp = caps[("mtp", 200)]
    assert (mtp.meets, mtp.fails[0]) == (4, 6)
    assert (mtp.last.verdict, mtp.first_fail.verdict) == ("meets", "uncertain")
    six = [doc.figures(f).p90_tps for _, f in solo.point_runs(SOLO, (REPEATS,))[("mtp", 6)]]
    e = mtp.first_fail.p90
    text = " ".join((ROOT / "docs/gpu.md").read_text().split())
    assert (
        f"met 200 in the ladder's run ({six[0]:.1f}) but not in either repeat ({six[1]:.1f}, "
        f"{six[2]:.1f}): the mean, {e.estimate:.1f}, is below the floor and its interval "
        f"[{e.low:.1f}, {e.high:.1f}] holds it"
    ) in text
    assert six[0] >= 200 > max(six[1:]) and e.low < 200 < e.high
    for k, c in caps.items():  # the others: an end of their bracket is one run
        if k not in (("dedicated-decode", 200), ("mtp", 200)):
            assert any(x is not None and x.p90.n == 1 for x in (c.last, c.first_fail)), k


def test_the_sweep_folder_gives_the_docs_frontier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agent-replay frontier` on the folder ``--sweep`` writes (its library call, the plots
    left out) prints the doc's frontier table and the reference file's rows."""
    from agent_replay.analysis import frontier

    monkeypatch.setattr(frontier, "plot", lambda *a, **k: None)
    solo.write_sweep(tmp_path / "solo", SOLO)
    res = frontier.build([tmp_path / "solo"], reference=solo.REFERENCE)
    assert solo.frontier_solo_table(SOLO) in res["markdown"]
    rows = [ln for ln in solo.reference_section(SOLO).splitlines() if ln.startswith("|")]
    assert rows and all(r in res["markdown"] for r in rows)
    got = solo.point_runs(SOLO, (REPEATS,))
    for p in res["points"]:  # every run of the point, the repeats included, by repeat
        runs = got[(p.target, int(p.point))]
        assert [r["repeat"] for r in p.runs] == [k for k, _ in runs]
        assert [r["p90_tps"] for r in p.runs] == [doc.figures(f).p90_tps for _, f in runs]
    assert sum(len(p.runs) for p in res["points"]) == 24
    mtp6 = next(p for p in res["points"] if (p.target, p.point) == ("mtp", 6.0))
    assert mtp6.ci["p90_tps"].n == 3 and mtp6.ci["p90_tps"].low is not None


def test_no_requested_setting_differs_on_the_solo_servers() -> None:
    for run in (SOLO, REPEATS):
        for name in solo.SOLO_SERVER.values():
            checks = runs.setting_checks(name, run)
            assert checks and [c.flag for c in checks if c.status == "differs"] == []
        ded = {c.flag: c.status for c in runs.setting_checks("ded", run)}
        for flag in (
            "--performance-mode",
            "--compilation-config.cudagraph_mode",
            "--kv-cache-memory-bytes",
        ):
            assert ded[flag] == "in effect", flag
    assert runs.requested("mtp", SOLO) == runs.requested("mtp", REPEATS)


def test_solo_acceptance_is_the_synthetic_setting() -> None:
    for prof in ("mtp", "dedicated-decode"):
        for folder in solo.all_folders(SOLO, (REPEATS,)):
            if folder.parent.parent.name == prof:
                a, n = doc.acceptance_length(folder)
                assert abs(1 + a / n - 2.49) < 0.06, folder
