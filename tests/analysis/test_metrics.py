from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from agent_replay.analysis.fixtures import rows_to_table
from agent_replay.analysis.metrics import chunk_samples, request_metrics, stats_rows
from tests.analysis.rows import ALL_ROWS, ROW_A, ROW_B


def _eq(a: np.ndarray, b: list[float]) -> bool:
    return bool(np.array_equal(a, np.array(b, dtype=np.float64), equal_nan=True))


NAN = float("nan")


def test_request_metrics_on_hand_computed_rows() -> None:
    m = request_metrics(rows_to_table(ALL_ROWS))
    # rows: A, B (one token), C (one 4-token chunk), D (failed), E (empty), W (warmup)
    assert _eq(m.schedule_lag, [10, 0, 5, 0, 1, 0])
    assert _eq(m.ttft, [100, 100, 95, NAN, NAN, 10_000])
    assert _eq(m.ttft_intended, [110, 100, 100, NAN, NAN, 10_000])
    assert _eq(m.e2e, [210, 110, 100, NAN, 49, 20_000])
    assert _eq(m.e2e_intended, [220, 110, 105, NAN, 50, 20_000])
    assert _eq(m.decode, [90, 0, 0, NAN, NAN, 10_000])
    assert _eq(m.tpot, [18, NAN, NAN, NAN, NAN, 10_000])
    assert m.tps[0] == pytest.approx(1e9 / 18)
    assert m.output_tokens.tolist() == [6, 1, 4, 0, 0, 2]
    assert m.decode_tokens.tolist() == [5, 0, 0, 0, 0, 1]
    assert m.chunks.tolist() == [3, 1, 1, 0, 0, 2]


def test_send_time_is_after_a_new_connection_opened() -> None:
    # S=100, started s0=110, 30 opening a connection: s=140, f=240, e=300.
    # schedule lag s0-S=10, TTFT f-s=100 (140 from intended), E2E e-s=160 (200 from intended).
    # The same row on a kept-alive connection (connect null): s=s0.
    row = dict(
        intended_ns=100,
        sent_ns=110,
        first_token_ns=240,
        end_ns=300,
        chunk_ns=[240, 270],
        chunk_tokens=[1, 1],
    )
    m = request_metrics(rows_to_table([{**row, "connect_ns": 30}, row]))
    assert _eq(m.schedule_lag, [10, 10])
    assert _eq(m.connect, [30, NAN])
    assert _eq(m.ttft, [100, 130])
    assert _eq(m.ttft_intended, [140, 140])
    assert _eq(m.e2e, [160, 190])
    assert _eq(m.e2e_intended, [200, 200])
    assert _eq(m.tpot, [30, 30])


def test_chunk_samples_count_each_gap_k_times_for_itl() -> None:
    t = rows_to_table(ALL_ROWS)
    ok, counted = stats_rows(t)
    assert ok.tolist() == [True, True, True, False, True, False]
    assert counted.tolist() == [True, True, True, True, True, False]
    s = chunk_samples(t, ok)
    assert s.itl.tolist() == [25, 13] and s.itl_weight.tolist() == [2, 3]
    assert s.chunk_gap.tolist() == [50, 40]
    assert sorted(s.tokens.tolist()) == [1, 1, 2, 3, 4]
    every = chunk_samples(t)
    assert every.chunk_gap.tolist() == [50, 40, 10_000]


def test_sliced_batches_give_the_same_metrics() -> None:
    t = rows_to_table([ROW_A, ROW_B, ROW_A])
    b = t.to_batches()[0].slice(1, 2)
    m = request_metrics(b)
    assert _eq(m.tpot, [NAN, 18])
    s = chunk_samples(b)
    assert s.chunk_gap.tolist() == [50, 40]


def test_mismatched_chunk_lists_are_rejected() -> None:
    bad = dict(ROW_A, chunk_tokens=[1, 2])
    with pytest.raises(ValueError, match="differ"):
        chunk_samples(rows_to_table([bad]))


def test_chunked_table_columns_are_handled() -> None:
    t = pa.concat_tables([rows_to_table([ROW_A]), rows_to_table([ROW_B])])
    assert t.column("chunk_ns").num_chunks == 2
    assert request_metrics(t).output_tokens.tolist() == [6, 1]
