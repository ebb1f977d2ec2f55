"""Hand-computed example rows shared by the analysis tests."""

from __future__ import annotations

from typing import Any

# A: S=100 s=110 f=210, chunks at 210/260/300 with 1/2/3 tokens, e=320.
#    lag 10, TTFT 100 (110 from intended), E2E 210 (220), N=6, decode 90, TPOT 90/5=18,
#    ITL: 50/2=25 x2, 40/3=13 (floor) x3; chunk gaps 50, 40; tokens per chunk 1, 2, 3.
ROW_A: dict[str, Any] = dict(
    session_id="a",
    request_index=0,
    intended_ns=100,
    sent_ns=110,
    first_token_ns=210,
    end_ns=320,
    chunk_ns=[210, 260, 300],
    chunk_tokens=[1, 2, 3],
    expected_input_tokens=100,
    expected_output_tokens=6,
    prompt_tokens=100,
    completion_tokens=6,
    cached_tokens=40,
    implied_cached_tokens=50,
)
# B: one-token output: no TPOT, decode 0.
ROW_B: dict[str, Any] = dict(
    session_id="a",
    request_index=1,
    parent_index=0,
    intended_ns=400,
    sent_ns=400,
    first_token_ns=500,
    end_ns=510,
    chunk_ns=[500],
    chunk_tokens=[1],
    parent_end_ns=320,
    think_ns=80,
    expected_input_tokens=200,
    expected_output_tokens=1,
    prompt_tokens=200,
    completion_tokens=1,
    cached_tokens=100,
    implied_cached_tokens=100,
)
# C: one chunk of 4 tokens (speculative first chunk): N - k_1 = 0, no TPOT.
ROW_C: dict[str, Any] = dict(
    session_id="b",
    request_index=0,
    intended_ns=600,
    sent_ns=605,
    first_token_ns=700,
    end_ns=705,
    chunk_ns=[700],
    chunk_tokens=[4],
    expected_input_tokens=50,
    expected_output_tokens=8,
    prompt_tokens=50,
    completion_tokens=4,
    cached_tokens=0,
    implied_cached_tokens=0,
)
# D: failed.
ROW_D: dict[str, Any] = dict(
    session_id="b",
    request_index=1,
    parent_index=0,
    intended_ns=800,
    sent_ns=800,
    status="error",
    error_kind="http",
    http_status=503,
    expected_input_tokens=60,
    expected_output_tokens=5,
)
# E: ok but no output at all (empty decode).
ROW_E: dict[str, Any] = dict(
    session_id="c",
    request_index=0,
    intended_ns=900,
    sent_ns=901,
    end_ns=950,
    chunk_ns=[],
    chunk_tokens=[],
    expected_input_tokens=10,
    expected_output_tokens=3,
    prompt_tokens=10,
    completion_tokens=0,
    cached_tokens=0,
    implied_cached_tokens=0,
)
# W: a warmup row, kept out of every statistic.
ROW_W: dict[str, Any] = dict(
    session_id="w",
    request_index=0,
    warmup=True,
    intended_ns=0,
    sent_ns=0,
    first_token_ns=10_000,
    end_ns=20_000,
    chunk_ns=[10_000, 20_000],
    chunk_tokens=[1, 1],
    expected_input_tokens=5,
    expected_output_tokens=2,
    prompt_tokens=5,
    completion_tokens=2,
)
ALL_ROWS = [ROW_A, ROW_B, ROW_C, ROW_D, ROW_E, ROW_W]
