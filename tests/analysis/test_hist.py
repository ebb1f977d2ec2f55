from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from agent_replay.analysis.hist import Hist, min_count_for, percentile_summary, rank


def test_vectorized_recording_matches_reference_hdrhistogram() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(16, 2, 20_000).astype(np.int64)
    ours, ref = Hist(), HdrHistogram(1, 3_600 * 10**9, 3)
    ours.record_many(values)
    for v in values.tolist():
        ref.record_value(v)
    assert np.array_equal(np.ctypeslib.as_array(ref.counts), ours._counts)
    for p in (0.0, 1.0, 50.0, 90.0, 99.0, 99.9):
        assert ours.percentiles([p])[p] == ref.get_value_at_percentile(p)
    assert ours.count == 20_000 and ours.max == ref.get_max_value()
    assert ours.mean() == pytest.approx(ref.get_mean_value())


def test_weighted_recording_and_out_of_range_values_are_dropped_and_counted() -> None:
    h = Hist(highest=10**6)
    assert h.record(5) is True
    assert h.record(-1) is False
    assert h.record(10**9) is False
    lost = h.record_many(np.array([7, -3, 2 * 10**9, 9]), np.array([2, 4, 5, 1]))
    assert lost == 9
    assert h.dropped == 11
    assert h.count == 1 + 2 + 1
    assert h.percentiles([50.0, 100.0]) == {50.0: 7, 100.0: 9}


def test_encode_decode_merge_roundtrip() -> None:
    a, b = Hist(), Hist()
    a.record_many(np.arange(1, 1001))
    b.record_many(np.arange(1001, 3001))
    b.dropped = 3
    c = Hist.decode(a.encode(), a.dropped)
    c.merge(Hist.decode(b.encode(), b.dropped))
    assert c.count == 3000 and c.dropped == 3
    assert c.percentiles([50.0])[50.0] == 1500
    assert c.max in (3000, 3001) and c.min == 1  # bucket of width 2 above 2048
    with pytest.raises(ValueError):
        Hist.decode("not base64!!")


def test_exact_percentiles_inverted_cdf_with_counts_and_reliability() -> None:
    s = percentile_summary(np.array([5.0, 1.0, np.nan, 3.0, 2.0, 4.0]))
    assert s.count == 5 and s.exact
    # 50% of 5 samples = 2.5 -> the 3rd smallest; 90% -> 4.5 -> the 5th.
    assert s.values[50.0] == 3.0 and s.values[90.0] == 5.0 and s.max == 5.0
    assert s.reliable == {50.0: True, 90.0: False, 99.0: False, 99.9: False}
    w = percentile_summary(np.array([10.0, 20.0]), weights=np.array([9, 1]))
    assert w.count == 10 and w.values[50.0] == 10.0 and w.values[90.0] == 10.0
    assert w.values[99.0] == 20.0 and w.mean == pytest.approx(11.0)
    empty = percentile_summary(np.array([np.nan]))
    assert empty.count == 0 and empty.values[50.0] is None


def test_min_count_rule() -> None:
    assert [min_count_for(p) for p in (50.0, 90.0, 99.0, 99.9)] == [2, 10, 100, 1000]


def test_rank_is_inverted_cdf_in_integer_arithmetic() -> None:
    assert rank(99.9, 20_000) == 19_980
    assert rank(90.0, 568) == 512  # 511.2 -> 512
    assert rank(50.0, 1) == 1 and rank(0.0, 10) == 1 and rank(100.0, 7) == 7
    h = Hist()
    h.record_many(np.arange(1, 569))
    assert h.percentiles([90.0])[90.0] == 512
