"""docs/sim-engine.md's error table against the committed data, and that data against a
fresh fit and prediction from the committed GPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


se = load_script("benchmarks/sim/sim_error.py")


def test_error_and_spread_by_hand() -> None:
    # measured 10, 12, 14: mean 12; predicted 13 and 14: mean 13.5 -> +12.5%
    assert se.error([10.0, 12.0, 14.0], [13.0, 14.0]) == pytest.approx(0.125)
    # the farthest repeat is 2 from the mean of 12
    assert se.spread([10.0, 12.0, 14.0]) == pytest.approx(2 / 12)
    assert se.spread([5.0]) is None and se.error([None], [1.0]) is None
    # TTFT: 10% target, or the spread when wider; TPOT 3%; other figures have none
    assert se.met("ttft_p50_ms", 0.12, 0.05) is False
    assert se.met("ttft_p50_ms", 0.12, 0.15) is True
    assert se.met("tpot_p90_ms", -0.03, None) is True
    assert se.met("p90_tps", 0.5, None) is None


def test_doc_has_the_table_and_summary() -> None:
    assert se.main(["--check", str(ROOT / "docs/sim-engine.md")]) == 0


@pytest.mark.parametrize("which", [0, 3])  # an H200 deployment and the H100 solo standard
def test_committed_data_is_what_a_fresh_fit_and_prediction_give(tmp_path: Path, which: int) -> None:
    from agent_replay.engines.sim.fit import fit_runs, read_command
    from agent_replay.engines.sim.predict import predict_run
    from agent_replay.engines.sim.profile import SimProfile

    ex = se.EXPERIMENTS[which]
    committed = json.loads((se.OUT / f"{ex.name}.json").read_text())
    fit = fit_runs(
        [se._rel(f) for p in ex.fit for f in ex.folders(p)],
        name=ex.name,
        command=read_command(ex.command),
    )
    assert fit.profile.to_dict() == committed
    data = se.load()
    assert data["experiments"][which]["name"] == ex.name
    point = data["experiments"][which]["points"][0]
    source = ROOT / point["runs"][0]
    out = predict_run(SimProfile.from_dict(committed), source, tmp_path / "p")
    got = se.figures(out)
    assert got == pytest.approx(point["predicted"][0], rel=1e-9)
    assert se.figures(source) == pytest.approx(point["measured"][0], rel=1e-9)


sc = load_script("benchmarks/sim/sim_capacity.py")


def test_doc_has_the_capacity_tables() -> None:
    assert sc.main(["--check", str(ROOT / "docs/sim-engine.md")]) == 0


def test_capacity_answer_wording() -> None:
    from agent_replay.replay.sweep.capacity import Capacity, Probe

    probes = [Probe(1, 1, 1, True, {}), Probe(8, 1, 0, False, {})]
    assert sc.answer(Capacity("", 1, probes, capacity=None)) == "below 1 (the lowest point fails)"
    assert (
        sc.answer(Capacity("", 1, probes, capacity=8)) == "at least 8 (the highest point, 8, meets)"
    )
    assert sc.answer(
        Capacity("", 1, probes, capacity=4, first_fail=6, crossing=(5.0, 4.5, 5.5))
    ) == ("4 (between 4 and 6); crossed at 5.0 [4.5, 5.5]")


def test_point_spread_borrows_the_stand_in_repeats() -> None:
    ex = {"spread_measured": [{"k": 10.0}, {"k": 12.0}, {"k": 14.0}]}
    assert se.point_spread(ex, {"measured": [{"k": 5.0}]}, "k") == (pytest.approx(2 / 12), "†")
    own = {"measured": [{"k": 9.0}, {"k": 11.0}]}
    assert se.point_spread(ex, own, "k") == (pytest.approx(0.1), "")
    assert se.point_spread({}, {"measured": [{"k": 5.0}]}, "k") == (None, "")


def test_capacity_data_gpu_side_is_what_the_committed_runs_give() -> None:
    data = sc.load()
    d = data["deployments"][0]
    folder = ROOT / d["gpu_runs"][2]
    if not folder.is_dir():
        pytest.skip("the committed GPU run is absent")
    assert sc.estimates(folder) == d["gpu"][folder.parent.name.removeprefix("c")]


def test_doc_figures_of_the_cache_split_and_the_misses() -> None:
    """The numbers docs/sim-engine.md quotes from the solo ladder and its fitted profiles."""
    import pyarrow.parquet as pq

    from agent_replay.engines.sim.predict import unrecorded_starts

    runs = se.SOLO / "results/runs"
    if not runs.is_dir():
        pytest.skip("the committed GPU runs are absent")
    cached: dict[str, list[float]] = {}
    computed: list[float] = []
    for name in ("standard", "mtp", "dedicated-decode"):
        prof = json.loads((se.OUT / f"h100-solo-{name}.json").read_text())
        split = prof["extra"]["fit"]["cached_below_ns_per_token"]
        terms = prof["extra"]["fit"]["terms"]
        assert terms["prefill_ns_per_token"]["samples"] in (37, 38)  # "37-38 lone prefills"
        assert terms["frontend_per_prompt_token_ns"]["low"] == 0
        for c in (1, 2, 4, 6, 8):
            vals = unrecorded_starts(pq.read_table(runs / name / f"c{c}/r1/requests").to_pylist())
            cached.setdefault(name, []).extend(v for v in vals if v < split)
            computed.extend(v for v in vals if v >= split)
    every = [v for vs in cached.values() for v in vs]
    assert (round(min(every) / 1e3, 1), round(max(every) / 1e3, 1)) == (1.0, 2.5)
    assert (round(min(computed) / 1e3), round(max(computed) / 1e3)) == (18, 43)
    assert (round(min(cached["mtp"]) / 1e3, 1), round(max(cached["mtp"]) / 1e3, 1)) == (1.1, 1.3)
    mtp = json.loads((se.OUT / "h100-solo-mtp.json").read_text())["extra"]["fit"]["terms"]
    assert round(mtp["frontend_per_prompt_token_ns"]["value"] / 1e3, 2) == 1.76
    highs = [
        json.loads((se.OUT / f"h100-solo-{n}.json").read_text())["extra"]["fit"]["terms"][
            "prefill_per_ctx_token_ns"
        ]["high"]
        for n in ("standard", "mtp", "dedicated-decode")
    ]
    assert (round(min(highs) / 1e3, 1), round(max(highs) / 1e3, 1)) == (7.5, 8.2)


def test_capacity_figures_lie_in_their_intervals() -> None:
    for d in sc.load()["deployments"]:
        for side in ("gpu", "virtual"):
            for figs in d[side].values():
                for f in figs.values():
                    if f["low"] is not None:
                        assert f["low"] <= f["value"] <= f["high"]
