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


def _hand_points(p90: dict[int, float]) -> list:
    from agent_replay.analysis.frontier import points

    return points(
        [
            {
                "phase": "sweep",
                "target": "x",
                "point": float(c),
                "repeat": 1,
                "status": "complete",
                "p90_tps": v,
                "tpot_n": 50,
            }
            for c, v in p90.items()
        ]
    )


def test_capacity_by_hand() -> None:
    pts = _hand_points({1: 250.0, 2: 180.0, 4: 210.0, 8: 90.0})
    cap = solo.capacity_of(pts, "x", 200)
    assert (cap.meets, cap.fails, cap.later, cap.few) == (1, (2, 180.0), (4,), False)
    assert solo._capacity_cell(cap) == "1 (at 2: 180.0); meets again at 4"
    assert solo.capacity_of(pts, "x", 50).fails is None
    assert solo._capacity_cell(solo.capacity_of(pts, "x", 50)) == "8 or more (the most tested)"
    assert solo.capacity_of(pts, "x", 300).meets == 0
    assert solo._capacity_cell(solo.capacity_of(pts, "x", 300)) == "none (at 1: 250.0)"
    # a P90 over fewer than 10 requests in a deciding run is marked
    few = _hand_points({1: 250.0, 2: 180.0})
    for p in few:
        p.runs[0]["tpot_n"] = 3
    assert solo._capacity_cell(solo.capacity_of(few, "x", 200)) == "1* (at 2: 180.0)"


def test_a_changed_solo_number_fails() -> None:
    text = (ROOT / "docs/gpu.md").read_text()
    blocks = doc.blocks()
    for name in ("solo ladder table", "capacity table"):
        row = blocks[name].splitlines()[-1]
        assert row in text
        assert doc.missing(text.replace(row, row.replace("|", "| 1", 2)[:-1] + "|")) == [name]
    sentence = blocks["ladder sentence"]
    assert sentence in " ".join(text.split())
    assert doc.missing(
        text.replace("along the solo ladder: standard", "along the solo ladder: standard 1")
    ) == ["ladder sentence"]


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
    assert solo.cards(RUN) == solo.cards(SOLO) and len(solo.cards(SOLO)) == 1
    assert solo.cards(SOLO)[0].startswith("NVIDIA H100 80GB HBM3")


def test_the_ladder_reading_holds() -> None:
    """The sentences of docs/gpu.md's solo ladder that read the table in words."""
    p90 = {(p, c): doc.figures(f).p90_tps for p, c, f in solo.solo_folders(SOLO)}
    total = {(p, c): doc.figures(f).total_per_gpu for p, c, f in solo.solo_folders(SOLO)}
    out = {(p, c): doc.figures(f).output_per_gpu for p, c, f in solo.solo_folders(SOLO)}
    lanes = (1, 2, 4, 6, 8)
    std = [p90[("standard", c)] for c in lanes]
    assert all(a > b for a, b in itertools.pairwise(std))  # loses speed with every lane
    assert max(doc.PROFILES, key=lambda p: p90[(p, 1)]) == "mtp"
    for c in lanes:  # mtp draws the most tokens per GPU at every lane count
        assert max(doc.PROFILES, key=lambda p: total[(p, c)]) == "mtp"
        assert max(doc.PROFILES, key=lambda p: out[(p, c)]) == "mtp"
    kept = {p: p90[(p, 8)] / p90[(p, 1)] for p in doc.PROFILES}
    assert max(kept, key=lambda p: kept[p]) == "dedicated-decode"
    assert p90[("dedicated-decode", 1)] < p90[("mtp", 1)]
    assert p90[("dedicated-decode", 8)] > p90[("mtp", 8)]


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
    assert [p.runs[0]["p90_tps"] for p in res["points"]] == [
        doc.figures(doc.run_dir(p.target, int(p.point), 1, SOLO)).p90_tps for p in res["points"]
    ]


def test_no_requested_setting_differs_on_the_solo_servers() -> None:
    for name in solo.SOLO_SERVER.values():
        checks = runs.setting_checks(name, SOLO)
        assert checks and [c.flag for c in checks if c.status == "differs"] == []
    ded = {c.flag: c.status for c in runs.setting_checks("ded", SOLO)}
    for flag in (
        "--performance-mode",
        "--compilation-config.cudagraph_mode",
        "--kv-cache-memory-bytes",
    ):
        assert ded[flag] == "in effect", flag


def test_solo_acceptance_is_the_synthetic_setting() -> None:
    for prof in ("mtp", "dedicated-decode"):
        acc = steps = 0.0
        for c in (1, 2, 4, 6, 8):
            a, n = doc.acceptance_length(doc.run_dir(prof, c, 1, SOLO))
            acc, steps = acc + a, steps + n
        assert abs(1 + acc / steps - 2.49) < 0.05
