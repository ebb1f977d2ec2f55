from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

from agent_replay.errors import TraceError
from agent_replay.traces.inspect import render_summary
from agent_replay.traces.io import conform
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.stats import (
    agent_streams,
    implied_cached_tokens,
    implied_hits,
    matched_blocks,
    prefix_reuse,
    session_cache,
    summarize,
)
from agent_replay.traces.validate import validate, validate_or_raise


def table(**cols: list[object]) -> pa.Table:
    n = len(next(iter(cols.values())))
    base: dict[str, list[object]] = {
        "session_id": ["s"] * n,
        "request_index": list(range(n)),
        "parent_index": [-1] + list(range(n - 1)),
        "arrival_ns": list(range(n)),
        "input_tokens": [16] * n,
        "output_tokens": [1] * n,
    }
    base.update(cols)
    return conform(pa.table(base))


def test_implied_cached_tokens_hand_computed() -> None:
    # arrival order: row0 (t=0), row1 (t=1, file order breaks the tie), row2 (t=1), row3 (t=5)
    t = table(
        arrival_ns=[0, 1, 1, 5],
        input_tokens=[30, 40, 20, 64],
        hash_ids=[[1, 2], [1, 2, 3], [1, 7], [9, 2, 3, 4]],
        session_id=["a", "b", "c", "d"],
        request_index=[0, 0, 0, 0],
        parent_index=[-1] * 4,
    )
    assert matched_blocks(t).tolist() == [0, 2, 1, 0]
    # counted in tokens: row0 left block 2 with 14 tokens, so row1 gets 16 + 14 = 30 and
    # stops there; row2 block 1 = 16; row3 leads with an unseen hash
    assert implied_cached_tokens(t, 16, server_block=1).tolist() == [0, 30, 16, 0]
    # as a server with 16-token blocks counts: row0's 14 tokens fill no server block, and
    # row2 (20 tokens) never gets its last token cached: (20 - 1) // 16 * 16 = 16
    assert implied_cached_tokens(t, 16).tolist() == [0, 16, 16, 0]
    assert prefix_reuse(t) == pytest.approx(3 / 11)


def test_implied_cached_tokens_caps_at_input_and_handles_nulls() -> None:
    t = table(input_tokens=[20, 20, 5], hash_ids=[[1, 2], [1, 2], None])
    assert implied_cached_tokens(t, 16, server_block=1).tolist() == [0, 20, 0]
    assert implied_cached_tokens(t, 16).tolist() == [0, 16, 0]
    assert prefix_reuse(table(hash_ids=[None, None])) is None


def test_a_partial_block_counts_for_what_it_filled() -> None:
    """Block size 64. Row 0 (100 tokens) ends with a 36-token block 2, which rows 1 and 2
    have whole: row 1 gets 64 + 32 (the partial block's 2 whole server blocks) and stops
    there; row 2 comes after row 1 filled block 2, so gets 64 + 64 + 52 (its last block
    whole, as row 1 left it), capped at its own last token: (180 - 1) // 16 * 16 = 176. Replay clones (``space``)
    share nothing."""
    lengths = np.array([2, 4, 3])
    flat = np.array([1, 2, 1, 2, 3, 4, 1, 2, 3])
    inputs = np.array([100, 250, 180])
    assert implied_hits(lengths, flat, inputs, np.arange(3), 64).tolist() == [0, 96, 176]
    assert implied_hits(lengths, flat, inputs, np.arange(3), 64, server_block=1).tolist() == [
        0,
        100,
        180,
    ]
    # the other way round: row 2 first leaves 48 tokens of block 3 whole in server blocks
    assert implied_hits(lengths, flat, inputs, np.array([2, 1, 0]), 64).tolist() == [96, 176, 0]
    assert implied_hits(
        lengths, flat, inputs, np.arange(3), 64, space=np.array([0, 1, 0])
    ).tolist() == [0, 0, 96]


def test_summary_counts() -> None:
    t = table(
        session_id=["a", "a", "b"],
        request_index=[0, 1, 0],
        parent_index=[-1, 0, -1],
        arrival_ns=[0, 61_000_000_000, 62_000_000_000],
        think_ns=[None, 2_000_000_000, None],
    )
    s = summarize(t, 16)
    assert (s.requests, s.sessions, s.span_ns) == (3, 2, 62_000_000_000)
    assert s.per_minute == [1, 2]
    assert s.think_s["count"] == 1 and s.think_s["p50"] == 2.0
    assert s.turns_per_session["max"] == 2


def test_valid_table_has_no_problems() -> None:
    t = table(hash_ids=[[1], [1], [1]], cached_tokens=[0, 16, 16])
    assert validate(t, TraceMeta(block_size=16), "ok.parquet") == []


@pytest.mark.parametrize(
    ("cols", "field", "row"),
    [
        ({"request_index": [0, 0, 1]}, "request_index", 1),
        ({"parent_index": [-1, 0, 2]}, "parent_index", 2),
        ({"parent_index": [-1, 0, -5]}, "parent_index", 2),
        ({"arrival_ns": [0, 10, 5]}, "arrival_ns", 2),
        ({"input_tokens": [16, -1, 16]}, "input_tokens", 1),
        ({"output_tokens": [1, 1, -3]}, "output_tokens", 2),
        ({"hash_ids": [[1], [1, 2], [1]]}, "hash_ids", 1),
        ({"cached_tokens": [0, 17, None]}, "cached_tokens", 1),
        ({"think_ns": [None, -1, 0]}, "think_ns", 1),
    ],
)
def test_each_rule_names_row_and_field(cols: dict[str, list[object]], field: str, row: int) -> None:
    problems = validate(table(**cols), TraceMeta(block_size=16), "bad.parquet")
    assert any(p.field == field and p.row == row for p in problems), problems
    with pytest.raises(TraceError, match=rf"bad\.parquet, row {row}"):
        validate_or_raise(table(**cols), TraceMeta(block_size=16), "bad.parquet")


def test_parent_must_exist_in_same_session() -> None:
    t = table(session_id=["a", "b"], request_index=[0, 1], parent_index=[-1, 0])
    problems = validate(t, TraceMeta(block_size=16), "x")
    assert [(p.row, p.field) for p in problems] == [(1, "parent_index")]


def test_wrong_types_and_missing_columns() -> None:
    t = pa.table({"session_id": ["a"], "request_index": pa.array([0], pa.int64())})
    fields = {p.field for p in validate(t, TraceMeta(), "x")}
    assert {"request_index", "arrival_ns", "input_tokens"} <= fields


def test_validate_is_vectorized_on_a_large_table() -> None:
    n = 200_000
    sess = np.repeat(np.arange(n // 10), 10)
    idx = np.tile(np.arange(10), n // 10)
    t = conform(
        pa.table(
            {
                "session_id": pa.array(sess.astype(str)),
                "request_index": pa.array(idx, pa.int32()),
                "parent_index": pa.array(idx - 1, pa.int32()),
                "arrival_ns": pa.array(idx * 10, pa.int64()),
                "input_tokens": pa.array(np.full(n, 5), pa.int32()),
                "output_tokens": pa.array(np.ones(n), pa.int32()),
            }
        )
    )
    assert validate(t, TraceMeta(), "big") == []
    bad = t.set_column(
        3, "arrival_ns", pa.array(np.where(np.arange(n) == 12345, 0, idx * 10), pa.int64())
    )
    problems = validate(bad, TraceMeta(), "big")
    assert [(p.row, p.field) for p in problems] == [(12345, "arrival_ns")]


def test_session_cache_rates_by_hand() -> None:
    """Two sessions, block size 16: b's second request shares a's first block (16 tokens
    implied); the server said 10 and 20 cached for a, nothing known for one of b's rows."""
    t = table(
        session_id=["a", "b", "a", "b"],
        request_index=[0, 0, 1, 1],
        parent_index=[-1, -1, 0, 0],
        arrival_ns=[0, 1, 2, 3],
        input_tokens=[48, 20, 50, 30],
        cached_tokens=[0, 0, 32, None],
        hash_ids=[[1, 2, 3], [7, 8], [1, 2, 3, 4], [1, 9]],
    )
    a, b = session_cache(t, 16)
    assert (a.session_id, a.requests, a.input_tokens) == ("a", 2, 98)
    assert a.server_cached == 32 and a.implied_cached == 48
    assert a.server_rate == pytest.approx(32 / 98) and a.implied_rate == pytest.approx(48 / 98)
    assert b.server_cached is None and b.implied_cached == 16 and b.server_rate is None
    s = summarize(t, 16)
    assert s.sessions_cache == [a, b]
    out = io.StringIO()
    Console(file=out, width=120).print(render_summary(s, TraceMeta(block_size=16), "t"))
    text = out.getvalue()
    assert "32.7%" in text and "49.0%" in text  # a: 32/98 server, 48/98 implied
    # the header: one implied figure, the replay's (the sessions' sum), and both rates on
    # the rows the server gave a figure for (b's second row has none): 32 and 48 of
    # 48 + 20 + 50 = 118 input tokens
    assert s.implied_cached_total == a.implied_cached + b.implied_cached == 64
    assert (s.cached_input_total, s.implied_on_cached) == (118, 48)
    flat = " ".join(text.split())
    assert (
        "(27.1% of the input of the requests it answered, by the server's usage; "
        "the trace implies 40.7%)" in flat
    )


def test_agent_streams_spawn_and_join_by_hand() -> None:
    """Session a: main 0, 1; subagent x (2, 3) spawned by 1; main 4 joins x. Session b has
    one stream and is not listed."""
    t = table(
        session_id=["a"] * 5 + ["b", "b"],
        request_index=[0, 1, 2, 3, 4, 0, 1],
        parent_index=[-1, 0, -1, 2, 1, -1, 0],
        arrival_ns=list(range(7)),
        agent_id=["main", "main", "x", "x", "main", "main", "main"],
        depends_on=[[], [0], [1], [2], [1, 3], [], [0]],
    )
    got = [
        (a.session_id, a.agent_id, a.turns, a.first, a.last, a.spawned_by, a.joined_by)
        for a in agent_streams(t)
    ]
    assert got == [("a", "main", 3, 0, 4, None, None), ("a", "x", 2, 2, 3, 1, 4)]
    out = io.StringIO()
    Console(file=out, width=120).print(
        render_summary(summarize(t, 16), TraceMeta(block_size=16), "t")
    )
    assert "spawned by" in out.getvalue() and "#1" in out.getvalue()


def test_inspect_shows_one_implied_figure_for_one_session() -> None:
    """One session, every row answered: the header's implied rate and the session table's
    are one figure, the one the replay expects (``implied_cached_total``): 32 of 48 + 50
    input tokens (the second row shares the first's two whole 16-token blocks)."""
    t = table(input_tokens=[48, 50], cached_tokens=[0, 16], hash_ids=[[1, 2, 3], [1, 2, 4, 5]])
    s = summarize(t, 16)
    assert s.implied_cached_total == s.implied_on_cached == 32
    out = io.StringIO()
    Console(file=out, width=120).print(render_summary(s, TraceMeta(block_size=16), "t"))
    flat = " ".join(out.getvalue().split())
    assert "the trace implies 32.7%)" in flat
    assert flat.count("32.7%") == 2  # the header's and the session's; the server said 16
    assert [f"{r.implied_rate:.1%}" for r in s.sessions_cache] == ["32.7%"]


def test_inspect_counts_a_continued_partial_block_as_the_replay_does() -> None:
    """Block size 64: the first prompt (40 tokens) is one partial block, which the second
    (100 tokens) continues as its first, full block: a prefix cache serves the 32 tokens
    of it that whole 16-token server blocks hold (``implied_cached_tokens``), not the
    whole block's 64. The header's figure is that one, as the session table's and the
    replay's are: 32 of 140 input tokens; the server said 16."""
    t = table(input_tokens=[40, 100], cached_tokens=[0, 16], hash_ids=[[7], [7, 8]])
    assert implied_cached_tokens(t, 64).tolist() == [0, 32]
    s = summarize(t, 64)
    assert s.implied_cached_total == s.implied_on_cached == 32
    out = io.StringIO()
    Console(file=out, width=120).print(render_summary(s, TraceMeta(block_size=64), "t"))
    flat = " ".join(out.getvalue().split())
    assert "(11.4% of input, by the server's usage; the trace implies 22.9%)" in flat
    assert [f"{r.implied_rate:.1%}" for r in s.sessions_cache] == ["22.9%"]
