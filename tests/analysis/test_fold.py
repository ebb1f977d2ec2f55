"""The block-wise fold of chunk samples and the blocked histogram recording agree exactly
with the one-shot computations they replace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hdrh.histogram import HdrHistogram

from agent_replay.analysis import hist
from agent_replay.analysis.fixtures import rows_to_table, synthetic_results
from agent_replay.analysis.fold import fold_chunks
from agent_replay.analysis.hist import Hist
from agent_replay.analysis.metrics import Lists, chunk_samples, lists, request_metrics, stats_rows
from tests.analysis.rows import ALL_ROWS


def _reference(t: pa.Table, rows: np.ndarray | None) -> tuple[Hist, Hist, dict[int, int]]:
    s = chunk_samples(t, rows)
    itl, gap = Hist(), Hist()
    itl.record_many(s.itl, s.itl_weight)
    gap.record_many(s.chunk_gap)
    vals, counts = np.unique(s.tokens, return_counts=True)
    return itl, gap, dict(zip(vals.tolist(), counts.tolist(), strict=True))


def _tpc(counts: np.ndarray) -> dict[int, int]:
    return {i: int(n) for i, n in enumerate(counts.tolist()) if n}


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_fold_equals_chunk_samples(block: int) -> None:
    t = synthetic_results(300, seed=5, failed_fraction=0.1)
    ok, _ = stats_rows(t)
    c, k = lists(t, "chunk_ns"), lists(t, "chunk_tokens")
    for rows in (None, ok):
        ref_itl, ref_gap, ref_tpc = _reference(t, rows)
        itl, gap = Hist(), Hist()
        tpc = fold_chunks(c, k, rows, itl, gap, block=block)
        assert np.array_equal(itl._counts, ref_itl._counts)
        assert np.array_equal(gap._counts, ref_gap._counts)
        assert (itl.count, itl.min, itl.max) == (ref_itl.count, ref_itl.min, ref_itl.max)
        assert (gap.count, gap.min, gap.max) == (ref_gap.count, ref_gap.min, ref_gap.max)
        assert _tpc(tpc) == ref_tpc


def test_fold_hand_computed_rows() -> None:
    t = rows_to_table(ALL_ROWS)
    ok, _ = stats_rows(t)
    itl, gap = Hist(), Hist()
    tpc = fold_chunks(lists(t, "chunk_ns"), lists(t, "chunk_tokens"), ok, itl, gap, block=2)
    # A: gaps 50 (2 tokens), 40 (3 tokens) -> ITL 25 x2, 13 x3; B, C: one chunk each.
    assert gap.count == 2 and gap.percentiles([0.0, 100.0]) == {0.0: 40, 100.0: 50}
    assert itl.count == 5 and itl.percentiles([50.0, 100.0]) == {50.0: 13, 100.0: 25}
    assert _tpc(tpc) == {1: 2, 2: 1, 3: 1, 4: 1}


def test_fold_empty_rows_negative_gaps_and_zero_tokens() -> None:
    # rows: [] | [5, 3] (negative gap: dropped) | [10, 20, 41] with k 0, 1, 2 | []
    c = Lists(np.array([5, 3, 10, 20, 41]), np.array([0, 0, 2, 5, 5]))
    k = Lists(np.array([1, 1, 0, 1, 2], dtype=np.int32), c.offsets)
    itl, gap = Hist(), Hist()
    tpc = fold_chunks(c, k, None, itl, gap, block=1)
    assert gap.count == 2 and gap.dropped == 1  # 10 and 21 kept, -2 dropped
    assert itl.count == 3 and itl.percentiles([0.0, 100.0]) == {0.0: 10, 100.0: 10}  # 21 // 2
    assert itl.dropped == 1  # the negative gap, weight 1
    assert _tpc(tpc) == {0: 1, 1: 3, 2: 1}
    with pytest.raises(ValueError, match="differ"):
        fold_chunks(c, Lists(k.values[:4], np.array([0, 0, 2, 4, 4])), None, itl, gap)


def test_null_list_owning_values_is_empty() -> None:
    # Arrow allows a null list slot to span child values; those are not the row's chunks.
    values = pa.array([1, 2, 3, 4, 5], pa.int64())
    col = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 5], pa.int32()), values, mask=pa.array([False, True, False])
    )
    assert col.null_count == 1 and col.value_lengths().to_pylist() == [2, None, 1]
    lst = lists(pa.table({"chunk_ns": col}), "chunk_ns")
    assert lst.values.tolist() == [1, 2, 5] and lst.offsets.tolist() == [0, 2, 2, 3]


def test_request_metrics_with_given_lists_match() -> None:
    t = synthetic_results(200, seed=2, failed_fraction=0.1)
    a = request_metrics(t)
    b = request_metrics(t, lists(t, "chunk_ns"), lists(t, "chunk_tokens"))
    for name in ("tpot", "decode", "e2e", "output_tokens", "decode_tokens", "chunks"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True)


@pytest.mark.parametrize("lowest", [1, 1000])
def test_blocked_recording_matches_reference_at_bucket_edges(
    lowest: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hist, "RECORD_BLOCK", 1000)
    top = 3_600 * 10**9
    edges = [v + d for e in range(0, 42) for d in (-1, 0, 1) if 0 <= (v := 1 << e) + d <= top]
    rng = np.random.default_rng(11)
    values = np.concatenate(
        [
            np.array(edges + [0, top], dtype=np.int64),
            rng.integers(0, top, 5000),
            rng.lognormal(14, 3, 5000).astype(np.int64).clip(0, top),
        ]
    )
    weights = rng.integers(0, 4, values.size)
    ours, ref = Hist(top, lowest=lowest), HdrHistogram(lowest, top, 3)
    lost = ours.record_many(
        np.concatenate([values, [-5, top + 1]]), np.concatenate([weights, [2, 3]])
    )
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        if w:
            ref.record_value(v, w)
    assert lost == 5 and ours.dropped == 5
    assert np.array_equal(np.ctypeslib.as_array(ref.counts), ours._counts)
    assert ours.count == ref.get_total_count()
    assert (ours.min, ours.max) == (ref.get_min_value(), ref.get_max_value())


@pytest.mark.parametrize("block", [50, 1 << 16])
def test_one_token_chunks_share_the_bucket_work(block: int) -> None:
    # No speculative decoding (every k_j = 1), and a mix where some steps have k_j > 1.
    for p_k in ((1.0,), (0.98, 0.02)):
        t = synthetic_results(200, seed=6, tokens_per_chunk=p_k)
        ok, _ = stats_rows(t)
        ref_itl, ref_gap, ref_tpc = _reference(t, ok)
        itl, gap = Hist(), Hist()
        tpc = fold_chunks(lists(t, "chunk_ns"), lists(t, "chunk_tokens"), ok, itl, gap, block=block)
        assert np.array_equal(itl._counts, ref_itl._counts)
        assert np.array_equal(gap._counts, ref_gap._counts)
        assert (itl.count, itl.min, itl.max, itl.dropped) == (
            ref_itl.count,
            ref_itl.min,
            ref_itl.max,
            ref_itl.dropped,
        )
        assert _tpc(tpc) == ref_tpc


def test_record_into_two_histograms() -> None:
    a, b = Hist(), Hist()
    b.record(7)
    assert a.record_many(np.array([5, -1, 9, 5]), also=b) == 1
    assert (a.count, a.dropped, b.count, b.dropped) == (3, 1, 4, 1)
    assert a.percentiles([50.0, 100.0]) == {50.0: 5, 100.0: 9}
    assert b.percentiles([50.0, 100.0]) == {50.0: 5, 100.0: 9} and b.min == 5
    with pytest.raises(ValueError, match="ranges"):
        a.record_many(np.array([1]), also=Hist(highest=10**6))
