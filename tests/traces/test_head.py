"""``traces head`` fits 80 columns: one line per request, times in seconds."""

from __future__ import annotations

import io

import pyarrow as pa
from rich.console import Console

from agent_replay.traces.inspect import render_head


def test_head_fits_80_columns_with_times_in_seconds() -> None:
    n = 4
    table = pa.table(
        {
            "session_id": [f"claude-code-session-{'x' * 30}-{i}" for i in range(n)],
            "request_index": list(range(n)),
            "parent_index": [-1, 0, 1, 2],
            "arrival_ns": [0, 1_500_000_000, 212_345_678_901, 3_600_000_000_000],
            "think_ns": [None, 250_000_000, 5_000_000_000, 1_000],
            "input_tokens": [1_137, 20_000, 150_000, 8],
            "output_tokens": [61, 900, 4_000, 1],
            "cached_tokens": [0, 1_000, 140_000, None],
            "hash_ids": [[1, 2], [1, 2, 3], list(range(300)), []],
            "api": ["messages"] * n,
            "model": ["claude-sonnet-4"] * n,
            "ttft_ns": [1, 2, 3, 4],
            "end_ns": [5, 6, 7, 8],
            "agent_id": ["main", "main", "explore-subagent", "main"],
            "depends_on": [[], [0], [1], [1, 2]],
            **{f"extra_{i}": [i] * n for i in range(8)},  # a wide trace: 23 columns
        }
    )
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render_head(table, 10))
    lines = buf.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    header = lines[0].split()
    assert header[:3] == ["session", "#", "after"] and "arrival" in header
    rows = lines[1 : 1 + n]  # one line per request, no wrapping
    assert rows[2].split()[1] == "2" and "212.346" in rows[2] and "5.000" in rows[2]
    assert "3,600.000" in rows[3] and "150,000" in rows[2] and "300" in rows[2]
    assert "explore-sub…" in rows[2] and "1,2" in rows[3]  # long names cut, not wrapped
    rest = "\n".join(lines[1 + n :])
    assert "api: messages" in rest and "model: claude-sonnet-4" in rest  # shared by every row
    assert "ttft_ns" in rest and "extra_7" in rest  # the other columns are named, not squeezed
    assert "cached_tokens" in rest  # the first optional column to give way at 80 columns
    wide = io.StringIO()
    Console(file=wide, width=200, color_system=None).print(render_head(table, 10, width=200))
    assert "cached" in wide.getvalue().splitlines()[0]
