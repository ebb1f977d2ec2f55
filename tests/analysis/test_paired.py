from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from agent_replay.analysis.compare import compare_dirs, to_json
from agent_replay.analysis.fixtures import synthetic_batches, write_results
from agent_replay.analysis.hist import percentile_summary
from agent_replay.analysis.paired import (
    PAIRED_STATS,
    PairedStat,
    Pairs,
    not_pairable,
    pair_tables,
    paired_intervals,
    simultaneous,
    weighted_percentile,
)
from agent_replay.replay.cli import main

P90_TPOT = PairedStat("p90_tps", "P90 TPS", "tpot", 90.0, "nearest", True, True)


def test_paired_statistics_come_from_the_definitions_table() -> None:
    keys = [s.key for s in PAIRED_STATS]
    assert keys[:4] == ["p90_tps", "median_tps", "north_star", "ttft_p90_ms"]
    north = next(s for s in PAIRED_STATS if s.key == "north_star")
    assert (north.metric, north.p, north.method, north.speed) == (
        "e2e_per_token",
        90.0,
        "linear",
        True,
    )
    assert "output_tps" not in keys  # a run-level figure: no per-request twin


def test_weighted_percentile_equals_the_expanded_sample() -> None:
    rng = np.random.default_rng(3)
    x = np.sort(rng.lognormal(0, 1, 37))
    w = rng.integers(0, 4, size=(50, 37))
    w[:, 0] += 1  # no empty resample
    for p in (10.0, 50.0, 90.0, 99.0):
        near = weighted_percentile(x, w, p, "nearest")
        lin = weighted_percentile(x, w, p, "linear")
        for r in range(50):
            full = np.repeat(x, w[r])
            assert near[r] == percentile_summary(full, (p,)).values[p]
            assert lin[r] == pytest.approx(np.percentile(full, p, method="linear"))


def test_paired_interval_by_hand() -> None:
    # two sessions of one pair each: (10 ms, 11 ms) and (20 ms, 30 ms); the median (nearest
    # rank, the 1st of 2) of each side is 10 and 11 ms: +10%. Resampling 2 sessions: both s1
    # (1/4) or one of each (1/2) gives 11/10, both s2 (1/4) gives 30/20. The interval's low
    # end is +10%; its high end is ln 1.1 + sqrt(2 / (2 - 1)) x (ln 1.5 - ln 1.1) (the
    # small-sample stretch); every resampled log ratio is above 0: p = 0.
    stat = PairedStat("ttft_p50_ms", "TTFT P50", "ttft", 50.0, "nearest", False, False)
    pairs = Pairs(
        np.array([0, 1]),
        np.array([0.0, 1.0]),
        {"ttft": np.array([10e6, 20e6])},
        {"ttft": np.array([11e6, 30e6])},
    )
    (x,) = paired_intervals([pairs], stats=[stat], min_clusters=2, resamples=4000)
    assert (x.base, x.value, x.pairs, x.clusters) == (10.0, 11.0, 2, 2)
    assert x.change == pytest.approx(0.1)
    assert x.low == pytest.approx(0.1)
    assert x.high == pytest.approx(1.1 * (1.5 / 1.1) ** math.sqrt(2) - 1)
    assert x.p == 0.0
    # a speed: P90 TPS of the same pairs as TPOT, 1 / 10 ms vs 1 / 11 ms: 100 -> 90.9 tok/s
    (s,) = paired_intervals(
        [pairs], stats=[PairedStat("s", "S", "ttft", 50.0, "nearest", True, True)], min_clusters=2
    )
    assert (s.base, s.value) == (100.0, pytest.approx(1000 / 11))
    assert s.change == pytest.approx(10 / 11 - 1) and s.high == pytest.approx(10 / 11 - 1)


def test_run_pairs_are_averaged_on_the_log_scale_by_hand() -> None:
    # two run pairs of two one-pair sessions; the median (nearest rank, the 1st of 2) moves
    # 10 -> 11 ms in the first and 10 -> 12 ms in the second. The statistic is the mean of
    # the log ratios, sqrt(1.1 x 1.2) - 1 (a median pooled over both, 10 -> 12 ms, would say
    # +20%); every resample of either run pair keeps its ratio, so the interval is that point.
    stat = PairedStat("ttft_p50_ms", "TTFT P50", "ttft", 50.0, "nearest", False, False)
    s = np.array([0, 1])
    one = Pairs(
        s, np.array([0.0, 1.0]), {"ttft": np.array([10e6, 20e6])}, {"ttft": np.array([11e6, 22e6])}
    )
    two = Pairs(
        s, np.array([0.0, 1.0]), {"ttft": np.array([10e6, 20e6])}, {"ttft": np.array([12e6, 24e6])}
    )
    (x,) = paired_intervals([one, two], stats=[stat], min_clusters=4)
    assert x.change == pytest.approx(math.sqrt(1.1 * 1.2) - 1)
    assert (x.base, x.value) == (pytest.approx(10.0), pytest.approx(math.sqrt(11 * 12)))
    assert x.low == pytest.approx(x.change) and x.high == pytest.approx(x.change) and x.p == 0.0
    assert (x.pairs, x.clusters) == (4, 4)
    # a run pair with fewer pairs than the percentile needs: no interval, and it says so
    big = Pairs(
        np.arange(12), np.arange(12.0), {"tpot": np.full(12, 10e6)}, {"tpot": np.full(12, 11e6)}
    )
    small = Pairs(
        np.arange(5), np.arange(5.0), {"tpot": np.full(5, 10e6)}, {"tpot": np.full(5, 11e6)}
    )
    (y,) = paired_intervals([big, small], stats=[P90_TPOT])
    assert y.low is None and y.change == pytest.approx(10 / 11 - 1)
    assert (
        y.note
        == "no interval: 5 pairs in 17 sessions, it needs 10 pairs in each run pair in 4 sessions"
    )


def _population(
    rng: np.random.Generator, sessions: int, per: int, ratio: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TPOT pairs with a session level, per-request noise, and a target effect that varies by
    session and by request around ``ratio``."""
    s = np.repeat(np.arange(sessions), per)
    level = rng.normal(0, 0.3, sessions)[s] + rng.normal(0, 0.3, s.size)
    a = np.exp(np.log(20e6) + level)
    b = a * np.exp(np.log(ratio) + rng.normal(0, 0.04, sessions)[s] + rng.normal(0, 0.05, s.size))
    return s, a, b


def test_paired_interval_covers_the_true_ratio_in_at_least_95_percent() -> None:
    rng = np.random.default_rng(7)
    _, big_a, big_b = _population(rng, 100_000, 8, 1.1)
    truth = (
        percentile_summary(big_a, (90.0,)).values[90.0]
        / percentile_summary(big_b, (90.0,)).values[90.0]
        - 1
    )
    for sessions, strata in ((16, 1), (8, 3), (5, 1)):
        hits = 0
        trials = 300
        for t in range(trials):
            parts = []
            for _ in range(strata):
                s, a, b = _population(rng, sessions, 8, 1.1)
                parts.append(
                    Pairs(s, np.arange(s.size, dtype=np.float64), {"tpot": a}, {"tpot": b})
                )
            (x,) = paired_intervals(parts, stats=[P90_TPOT], resamples=400, seed=t)
            assert x.low is not None and x.high is not None
            hits += x.low <= truth <= x.high
        # measured 100% and 99%: the percentile bootstrap of a percentile errs wide here
        assert hits / trials >= 0.93, (sessions, strata, hits)


def _per_request(rows: list[tuple[str, int, bool, float]]) -> pa.Table:
    return pa.table(
        {
            "session_id": [r[0] for r in rows],
            "clone": [0] * len(rows),
            "request_index": [r[1] for r in rows],
            "ok": [r[2] for r in rows],
            "intended_ns": [float(i) for i in range(len(rows))],
            "tpot": [r[3] for r in rows],
        }
    )


def test_requests_pair_by_identity_whatever_their_order() -> None:
    a = _per_request(
        [("s1", 0, True, 1.0), ("s1", 1, True, 2.0), ("s2", 0, True, 3.0), ("s2", 1, False, 4.0)]
    )
    b = _per_request(
        [("s2", 1, True, 40.0), ("s2", 0, True, 30.0), ("s1", 1, True, 20.0), ("s3", 0, True, 50.0)]
    )
    p = pair_tables(a, b, ["tpot"])
    # s1/0 is missing in b, s2/1 failed in a, s3 is not in a: two pairs remain, twin by twin
    got = sorted(zip(p.a["tpot"].tolist(), p.b["tpot"].tolist(), strict=True))
    assert got == [(2.0, 20.0), (3.0, 30.0)]
    assert len(set(p.session.tolist())) == 2


META = {
    "trace": {"path": "t.parquet", "sha256": "aa"},
    "target": {"model": "m"},
    "options": {"timing": "session", "speedup": 1.0},
}
BUSY = {
    "self_check": {
        "loop_lag_p99_ns": 20_000_000,
        "loop_lag_n": 500,
        "cpu_fraction": 0.2,
        "machine": {"cpus": 2, "busy_cores": 1.9, "steal": 0.0, "ours_cores": 0.2},
    }
}


def test_not_pairable_names_why() -> None:
    assert not_pairable(META, META) is None
    assert not_pairable({}, {}) == "not the same trace (by content hash)"
    other = META | {"options": {"timing": "session", "speedup": 4.0}}
    assert not_pairable(META, other) == "not the same plan: speedup 1.0 vs 4.0"
    assert not_pairable(META, META | {"target": {"model": "other"}}) is None


def test_compare_pairs_runs_of_one_plan_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(2000, 1), META)
    b = write_results(tmp_path / "b", synthetic_batches(2000, 2, tpot_scale=1.15), META)
    c = compare_dirs([a, b], seed=3)
    ds = c.deltas[0]
    assert [d.key for d in ds] == [s.key for s in PAIRED_STATS]
    assert all(d.design.startswith("paired: ") and "100 sessions" in d.design for d in ds)
    assert c.verdicts[0].startswith("b is 1") and "slower at P90 TPS" in c.verdicts[0]
    assert any(v.startswith("b vs a: paired: ") for v in c.verdicts)
    assert '"design": "paired: ' in to_json(c)
    # the same run twice: every pair equal, every interval [0, 0], no verdict
    same = compare_dirs([a, a])
    assert all(
        d.change == 0 and d.ci_low == 0 == d.ci_high and not d.significant
        for d in same.deltas[0]
        if d.ci_low is not None
    )
    # without a trace hash (or with --force over different plans): the unpaired design
    u = write_results(tmp_path / "u", synthetic_batches(2000, 2, tpot_scale=1.15))
    assert compare_dirs([a, u], force=True).deltas[0][0].design.startswith("unpaired")
    assert main(["compare", str(a), str(b), "--format", "md"]) == 0
    assert "paired request by request" in capsys.readouterr().out


AT_ONCE = {
    "clock": {"t0_wall_ns": 1_800_000_000_000_000_000},
    "summary": {"wall_s": 10.0},
    "environment": {"host": "h"},
}
LATER = {
    "clock": {"t0_wall_ns": 1_800_000_000_000_000_000 + 10**10},
    "summary": {"wall_s": 10.0},
    "environment": {"host": "h"},
}


def test_simultaneous_runs_share_most_of_their_wall_time() -> None:
    assert simultaneous(AT_ONCE, AT_ONCE)
    assert not simultaneous(AT_ONCE, LATER)  # one after the other
    assert not simultaneous(AT_ONCE, AT_ONCE | {"environment": {"host": "other"}})
    assert not simultaneous({}, {})  # no clock: not known to overlap
    half = {
        "clock": {"t0_wall_ns": 1_800_000_000_000_000_000 + 5 * 10**9},
        "summary": {"wall_s": 10.0},
        "environment": {"host": "h"},
    }
    assert not simultaneous(AT_ONCE, half)  # 5 of 10 s shared, under 80%


def test_contention_gives_a_wider_paired_verdict_only_to_runs_made_at_once(tmp_path: Path) -> None:
    def w(name: str, seed: int, scale: float, *extra: dict) -> Path:
        meta = dict(META)
        for e in extra:
            meta |= e
        return write_results(tmp_path / name, synthetic_batches(2000, seed, tpot_scale=scale), meta)

    quiet = compare_dirs([w("a", 1, 1.0, AT_ONCE), w("b", 2, 1.15, AT_ONCE)], seed=3).deltas[0][0]
    assert quiet.design.startswith("paired: ") and "widened" not in quiet.design
    # both lanes of one invocation under contention: the paired verdict stands, wider
    lanes = compare_dirs(
        [w("a_busy", 1, 1.0, AT_ONCE, BUSY), w("b_busy", 2, 1.15, AT_ONCE, BUSY)], seed=3
    )
    head = lanes.deltas[0][0]
    assert "widened to the time-block bootstrap for host contention" in head.design
    assert head.ci_low is not None and head.ci_high is not None
    assert quiet.ci_low is not None and quiet.ci_high is not None
    assert head.ci_low <= quiet.ci_low and head.ci_high >= quiet.ci_high
    assert head.significant and "slower at P90 TPS" in lanes.verdicts[0]
    # the same runs made one after the other: not paired, and one run per side refuses
    seq = compare_dirs(
        [w("a_seq", 1, 1.0, AT_ONCE, BUSY), w("b_seq", 2, 1.15, LATER, BUSY)], seed=3
    )
    assert seq.deltas[0][0].ci_low is None and seq.deltas[0][0].design.startswith("unpaired")
    assert seq.verdicts[0].startswith(
        "b_seq vs a_seq: no verdict: host contention in run a_seq, b_seq"
    )
    assert "not paired: host contention in runs made one after the other" in seq.verdicts[0]
    assert "--targets A,B" in seq.verdicts[0]
