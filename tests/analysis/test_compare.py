from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.compare import bootstrap_percentile, compare_arrays, compare_dirs, to_json
from analysis.fixtures import synthetic_batches, synthetic_results, write_results
from analysis.metrics import request_metrics
from replay.cli import main


def test_beta_order_statistic_bootstrap_matches_explicit_resampling() -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.lognormal(0, 0.5, 300))
    fast = bootstrap_percentile(x, 90.0, 20_000, np.random.default_rng(1))
    idx = np.random.default_rng(2).integers(0, x.size, (20_000, x.size))
    slow = np.sort(x[idx], axis=1)[:, 269]  # rank(90, 300) = 270
    assert np.mean(fast) == pytest.approx(np.mean(slow), rel=2e-3)
    assert np.std(fast) == pytest.approx(np.std(slow), rel=0.05)


def _arrays(n: int, seed: int, scale: float) -> dict[str, np.ndarray]:
    m = request_metrics(synthetic_results(n, seed, tpot_scale=scale, median_output_tokens=30,
                                          failed_fraction=0.0))
    return {"tpot": m.tpot, "ttft": m.ttft}


@pytest.mark.slow
def test_five_percent_tpot_difference_is_found_and_zero_is_not() -> None:
    hits = {1.05: 0, 1.0: 0}
    false_p90 = 0
    for trial in range(100):
        for scale in hits:
            ds = {d.key: d for d in compare_arrays(_arrays(2000, 2 * trial, 1.0),
                                                   _arrays(2000, 2 * trial + 1, scale),
                                                   seed=trial)}
            hits[scale] += ds["tpot_p50"].significant
            if scale == 1.0:
                false_p90 += ds["tpot_p90"].significant or ds["tps_p90"].significant
    assert hits[1.05] >= 95
    assert 100 - hits[1.0] >= 95
    assert 100 - false_p90 >= 90  # two statistics, each at a 5% false-positive rate


def test_compare_cli_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_results(tmp_path / "a", synthetic_batches(3000, 1))
    b = write_results(tmp_path / "b", synthetic_batches(3000, 2, tpot_scale=1 / 1.26))
    c = compare_dirs([a, b], seed=3)
    head = c.verdicts[0]
    assert head.startswith("b is 2") and "% faster at P90 TPS, 95% CI" in head
    assert '"significant": true' in to_json(c)
    assert main(["compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "no significant difference" in out and "P90 TPS" in out
    assert main(["compare", str(a)]) == 2
