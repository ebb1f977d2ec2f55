"""The flush in small steps: part files built in slices are the files one conversion of
all rows makes, and the flush thread's pause waits for the event loop's ready callbacks."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent_replay.replay.record.recorder import LoopTurn
from agent_replay.replay.record.sink import (
    SLICE_ROWS,
    PartWriter,
    rows_to_table,
    rows_to_table_in_slices,
)
from agent_replay.traces.io import read_trace
from agent_replay.traces.schema import TraceMeta


def _rows(n: int = 11) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(n):
        rows.append({
            "session_id": f"s{i % 4}", "request_index": i, "parent_index": i - 1,
            "arrival_ns": 1000 * i, "input_tokens": 10 + i, "output_tokens": i,
            "api": "chat" if i % 3 else "messages", "model": None if i == 5 else f"m{i % 2}",
            "agent_id": "main" if i % 2 else None,
            # a big body's ids come as an array: in one slice only
            "hash_ids": np.arange(i, dtype=np.int64) if i == 7 else ([i, i + 1] if i % 5 else None),
            "chunk_gaps_ns": [i, 2 * i] if i else None, "chunk_tokens": [1, 1] if i else None,
            "error": "upstream timeout" if i == 3 else None, "http_status": 200,
            "stream": bool(i % 2),
        })
    return rows


def test_slices_make_the_same_table() -> None:
    rows = _rows()
    pauses: list[int] = []
    got = rows_to_table_in_slices(rows, lambda: pauses.append(1), size=3)
    assert len(pauses) == 3  # 11 rows in slices of 3: 4 slices, a pause between two
    want = rows_to_table(rows)
    assert got.equals(want)
    assert got.schema == want.schema
    assert all(col.num_chunks == 1 for col in got.columns)
    assert got.column("session_id").chunk(0).dictionary.to_pylist() == ["s0", "s1", "s2", "s3"]


def test_few_rows_need_no_pause() -> None:
    rows = _rows()[:3]
    pauses: list[int] = []
    assert rows_to_table_in_slices(rows, lambda: pauses.append(1), size=3).equals(
        rows_to_table(rows))
    assert pauses == []


def test_part_file_is_the_same_bytes(tmp_path: Path) -> None:
    rows = _rows(3 * SLICE_ROWS + 1)
    meta = TraceMeta(block_size=16, source="recorded", content_mode="hashed",
                     start_wall_ns=123)
    whole, sliced = PartWriter(tmp_path / "a"), PartWriter(tmp_path / "b")
    pauses: list[int] = []
    sliced.pause = lambda: pauses.append(1)
    pa_, pb = whole.write(rows, meta), sliced.write(rows, meta)
    assert len(pauses) == 3
    assert pa_.read_bytes() == pb.read_bytes()
    assert read_trace(tmp_path / "b")[0].num_rows == len(rows)


async def test_pause_waits_for_the_loops_ready_callbacks() -> None:
    loop = asyncio.get_running_loop()
    order: list[str] = []
    busy_started = threading.Event()

    def worker() -> None:
        busy_started.wait(5)
        LoopTurn(loop)()  # begins while the loop runs ``busy``: returns after it
        order.append("worker")

    def busy() -> None:
        busy_started.set()
        time.sleep(0.05)  # the worker, free to run meanwhile, must not pass its pause
        order.append("loop")

    thread = threading.Thread(target=worker)
    thread.start()
    loop.call_soon(busy)
    while thread.is_alive():
        await asyncio.sleep(0.005)
    assert order == ["loop", "worker"]


def test_pause_on_a_closed_loop_returns() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    LoopTurn(loop)()  # a flush that ends after its loop closed: returns, no error
