from __future__ import annotations

import numpy as np
import pytest

from agent_replay.analysis import live
from agent_replay.analysis.fixtures import rows_to_table, synthetic_results
from agent_replay.analysis.live import LiveStats
from agent_replay.analysis.metrics import chunk_samples, request_metrics, stats_rows
from tests.analysis.rows import ALL_ROWS, ROW_A


def test_observe_hand_computed_rows() -> None:
    st = LiveStats()
    for row in rows_to_table(ALL_ROWS).to_pylist():
        st.observe_request(row)
    st.flush()
    assert (st.ok, st.failed, st.warmup) == (4, 1, 1)
    assert st.errors == {"http": 1}
    assert st.hists["ttft"].count == 3  # A, B, C (E has no first token)
    assert st.hists["e2e"].count == 4
    assert st.hists["tpot"].count == 1 and st.hists["tpot"].max == 18
    assert st.hists["itl"].count == 5  # 2 + 3 tokens
    assert st.hists["itl"].percentiles([50.0])[50.0] == 13
    assert st.hists["chunk_gap"].count == 2
    assert st.tokens_per_chunk == {1: 2, 2: 1, 3: 1, 4: 1}
    assert st.output_tokens == 11
    assert st.throughput == {0: [11, 4]}


def test_lag_and_progress() -> None:
    st = LiveStats()
    st.observe_lag(1_500_000, 200_000)
    st.observe_lag(-5, None)
    assert st.early_sends == 1
    assert st.hists["schedule_lag"].count == 2 and st.hists["loop_lag"].count == 1
    st.set_progress(10, 100, 3, 2, 5_000_000_000, 12.5)
    assert (st.done, st.total, st.in_flight, st.active_sessions) == (10, 100, 3, 2)


def test_encode_decode_merge_equals_single_pass() -> None:
    t = synthetic_results(600, seed=1, failed_fraction=0.05)
    rows = t.to_pylist()
    whole, a, b = LiveStats(), LiveStats(), LiveStats()
    for i, row in enumerate(rows):
        whole.observe_request(row)
        (a if i % 2 else b).observe_request(row)
    a.set_progress(300, 300, 1, 1, 10, 20.0)
    b.set_progress(300, 300, 2, 1, 12, 30.0)
    merged = LiveStats.decode(a.encode())
    merged.merge(LiveStats.decode(b.encode()))
    assert merged.ok == whole.ok and merged.failed == whole.failed
    assert merged.errors == whole.errors
    whole.flush()
    for name in ("ttft", "tpot", "itl", "chunk_gap", "e2e"):
        assert merged.hists[name].count == whole.hists[name].count
        assert merged.hists[name].percentiles() == whole.hists[name].percentiles()
    assert merged.throughput == whole.throughput
    assert merged.tokens_per_chunk == whole.tokens_per_chunk
    assert (merged.done, merged.in_flight, merged.elapsed_ns) == (600, 3, 12)
    assert merged.cpu_percent == [20.0, 30.0]
    # The live numbers agree with the exact batch metrics to HdrHistogram precision.
    ok, _ = stats_rows(t)
    m = request_metrics(t)
    exact_p90 = float(np.percentile(m.tpot[ok & ~np.isnan(m.tpot)], 90, method="inverted_cdf"))
    assert merged.hists["tpot"].percentiles([90.0])[90.0] == pytest.approx(exact_p90, rel=2e-3)
    s = chunk_samples(t, ok)
    assert merged.hists["itl"].count == int(s.itl_weight.sum())


def test_bounded_pending_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "FLUSH_CHUNKS", 4)
    st = LiveStats()
    row = rows_to_table([ROW_A]).to_pylist()[0]
    st.observe_request(row)
    st.observe_request(row)
    assert st._c == []  # flushed once past the bound
    assert st.hists["tpot"].count == 2


def test_bad_snapshot_version() -> None:
    with pytest.raises(ValueError, match="version"):
        LiveStats.decode(b'{"v": 99}')


def _arrays(row: dict[str, object], kind: str) -> dict[str, object]:
    from array import array

    out = dict(row)
    c, k = row["chunk_ns"] or [], row["chunk_tokens"] or []
    if kind == "array":
        out["chunk_ns"], out["chunk_tokens"] = array("q", c), array("i", k)  # type: ignore[arg-type]
    elif kind == "numpy":
        out["chunk_ns"] = np.asarray(c, dtype=np.int64)
        out["chunk_tokens"] = np.asarray(k, dtype=np.int32)
    return out


@pytest.mark.parametrize("kind", ["array", "numpy", "mixed"])
def test_chunk_arrays_and_lists_give_the_same_stats(kind: str) -> None:
    rows = synthetic_results(400, seed=8, failed_fraction=0.05).to_pylist()
    ref, st = LiveStats(), LiveStats()
    for i, row in enumerate(rows):
        ref.observe_request(row)
        st.observe_request(_arrays(row, kind if kind != "mixed" else ("array", "list")[i % 2]))
    ref.flush()
    st.flush()
    for name in ("ttft", "tpot", "itl", "chunk_gap", "e2e"):
        assert np.array_equal(st.hists[name]._counts, ref.hists[name]._counts), name
    assert st.tokens_per_chunk == ref.tokens_per_chunk and st.throughput == ref.throughput
    assert st.output_tokens == ref.output_tokens


def test_pending_work_is_bounded_and_flushed_in_pieces() -> None:
    rows = synthetic_results(600, seed=8).to_pylist()
    longest = max(len(r["chunk_ns"] or []) for r in rows)
    st = LiveStats()
    flushed_counts = []
    for row in rows:
        before = st.hists["chunk_gap"].count
        st.observe_request(row)
        assert st._pending_chunks <= live.FLUSH_CHUNKS + longest
        if st.hists["chunk_gap"].count != before:
            flushed_counts.append(st.hists["chunk_gap"].count)
    total = sum(len(r["chunk_ns"] or []) for r in rows)
    assert len(flushed_counts) >= total // (live.FLUSH_CHUNKS + longest)  # many small flushes


def test_loop_lags_in_bulk_match_one_by_one() -> None:
    one, bulk = LiveStats(), LiveStats()
    lags = [0, 5, 1_000, 2_500_000, -3, 40_000_000]
    for v in lags:
        one.observe_lag(None, v)
    bulk.observe_loop_lags(lags)
    bulk.observe_loop_lags([])
    a, b = one.hists["loop_lag"], bulk.hists["loop_lag"]
    assert a.count == b.count == 6
    assert a.percentiles([50.0, 100.0]) == b.percentiles([50.0, 100.0])
    assert b.percentiles([0.0])[0.0] == 0  # the negative sample counted as 0
