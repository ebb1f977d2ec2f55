"""A part write gives up its CPU between its stages (the event loop, when it shares the
CPU, runs in between), and the part is the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_replay.replay.record import sink
from agent_replay.traces.io import read_trace
from agent_replay.traces.schema import TraceMeta

ROW = {
    "session_id": "s",
    "request_index": 0,
    "parent_index": -1,
    "arrival_ns": 0,
    "input_tokens": 3,
    "output_tokens": 2,
    "api": "chat",
    "chunk_gaps_ns": [5, 6],
    "chunk_tokens": [1, 1],
    "hash_ids": [7],
}


def test_part_write_yields_between_stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(sink, "_sched_yield", lambda: calls.append(1))
    writer = sink.PartWriter(tmp_path / "t")
    path = writer.write(
        [ROW, {**ROW, "request_index": 1}],
        TraceMeta(block_size=64, source="recorded", content_mode="hashed"),
    )
    # after the Arrow conversion, the conform, the Parquet encoding and the close
    assert len(calls) == 4
    rows = read_trace(path)[0].to_pylist()
    assert [(r["request_index"], r["chunk_gaps_ns"]) for r in rows] == [(0, [5, 6]), (1, [5, 6])]


def test_per_row_yields_are_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A yield after every row could cost a time slice each on a busy CPU: with a gap, a
    burst of calls yields once."""
    calls: list[int] = []
    monkeypatch.setattr(sink, "_sched_yield", lambda: calls.append(1))
    monkeypatch.setattr(sink, "_last_yield_ns", -(10**18))
    for _ in range(100):
        sink.yield_cpu(60 * 10**9)
    assert len(calls) == 1
    sink.yield_cpu()  # the stages' yields are not spaced
    sink.yield_cpu()
    assert len(calls) == 3
