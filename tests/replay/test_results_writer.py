"""ResultWriter: the warm-up before t0 leaves no file, and rows written after it are intact."""

from __future__ import annotations

from array import array
from pathlib import Path

import pyarrow.parquet as pq

from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.results import ResultWriter


def _rec(i: int, t0: int) -> RequestRecord:
    r = RequestRecord(session_id=f"s{i}", request_index=0, parent_index=-1, clone=0, worker=0,
                      request_id=f"r{i}", api="completions", expected_input_tokens=8,
                      expected_output_tokens=3, implied_cached_tokens=0)
    r.intended_ns, r.sent_ns, r.first_token_ns, r.end_ns = t0 + 10, t0 + 12, t0 + 20, t0 + 40
    r.chunk_ns = array("q", [t0 + 20, t0 + 30, t0 + 40])
    r.chunk_tokens = array("i", [1, 1, 1])
    return r


def test_warm_runs_on_the_writer_thread_and_writes_nothing(tmp_path: Path) -> None:
    t0 = 5_000_000_000
    w = ResultWriter(tmp_path, t0)
    assert not w._pool._threads  # the thread starts with the first job
    w.warm()
    assert len(w._pool._threads) == 1  # started before the run
    assert list((tmp_path / "requests").iterdir()) == []  # the warm-up wrote to memory only
    assert w.rows == 0
    for i in range(3):
        w.add(_rec(i, t0))
    w.close()
    t = pq.read_table(tmp_path / "requests").to_pydict()
    assert t["request_id"] == ["r0", "r1", "r2"]  # no warm-up row among them
    assert t["chunk_ns"] == [[20, 30, 40]] * 3  # relative to t0
    assert t["sent_ns"] == [12] * 3
