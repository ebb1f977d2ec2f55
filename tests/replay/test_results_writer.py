"""ResultWriter: the warm-up before t0 leaves no file, and rows written after it are intact;
a part that cannot be written (ENOSPC) keeps its rows, retries them after a back-off, and
``close`` counts what it could not write instead of raising."""

from __future__ import annotations

import errno
import os
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agent_replay.replay import results as results_mod
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.results import ResultWriter


def _rec(i: int, t0: int) -> RequestRecord:
    r = RequestRecord(
        session_id=f"s{i}",
        request_index=0,
        parent_index=-1,
        clone=0,
        worker=0,
        request_id=f"r{i}",
        api="completions",
        expected_input_tokens=8,
        expected_output_tokens=3,
        implied_cached_tokens=0,
    )
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


class _Disk:
    """Parquet writes that fail with ENOSPC while ``full`` (after writing part of the
    temporary file, as a real full disk does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = True
        self.attempts = 0
        real = pq.write_table

        def write_table(table: Any, where: Any, **kw: Any) -> None:
            if isinstance(where, Path):
                self.attempts += 1
                if self.full:
                    where.write_bytes(b"PAR1 half a file")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(table, where, **kw)

        monkeypatch.setattr(results_mod.pq, "write_table", write_table)


def _ids(folder: Path) -> list[str]:
    return sorted(pq.read_table(folder / "requests").column("request_id").to_pylist())


def test_failed_part_keeps_its_rows_and_is_retried_after_a_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk(monkeypatch)
    t0 = 1_000
    w = ResultWriter(tmp_path, t0, flush_s=0.2)
    for i in range(5):
        w.add(_rec(i, t0))
    w.flush()
    w._pool.submit(lambda: None).result()  # the write is done
    w.tick(time.monotonic_ns())
    assert w.failing and w.held == 5 and w.written == 0
    assert w.error == "No space left on device"
    assert list((tmp_path / "requests").iterdir()) == []  # no half-written file left
    for i in range(5, 8):
        w.add(_rec(i, t0))
    w.flush()  # within the back-off: nothing is tried
    assert disk.attempts == 1 and w.held == 8
    disk.full = False
    time.sleep(0.25)
    w.flush()
    w._pool.submit(lambda: None).result()
    w.tick(time.monotonic_ns())
    assert not w.failing and w.held == 0 and w.written == 8 and disk.attempts == 2
    w.close()
    assert w.unwritten == 0
    assert _ids(tmp_path) == sorted(f"r{i}" for i in range(8))


def test_close_retries_then_counts_what_it_could_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Disk(monkeypatch)
    w = ResultWriter(tmp_path, 0, flush_s=0.05, retry_s=0.4)
    for i in range(7):
        w.add(_rec(i, 0))
    started = time.monotonic()
    w.close()  # never raises a write error
    took = time.monotonic() - started
    assert 0.4 <= took < 3
    assert w.unwritten == 7 and w.written == 0
    assert w.error == "No space left on device"
    assert list((tmp_path / "requests").iterdir()) == []


def test_close_writes_every_row_when_space_returns_during_its_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk(monkeypatch)
    w = ResultWriter(tmp_path, 0, flush_s=0.05, retry_s=10)
    for i in range(4):
        w.add(_rec(i, 0))
    threading.Timer(0.3, lambda: setattr(disk, "full", False)).start()
    w.close()
    assert w.unwritten == 0 and w.written == 4 and disk.attempts >= 2
    assert _ids(tmp_path) == ["r0", "r1", "r2", "r3"]


def test_held_rows_are_bounded_and_the_dropped_ones_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Disk(monkeypatch)
    one = 600 + 12 * 3  # a row of _rec as the writer prices it
    w = ResultWriter(tmp_path, 0, flush_s=0.05, retry_s=0, hold_bytes=4 * one)
    for i in range(10):
        w.add(_rec(i, 0))
    w.flush()
    w._pool.submit(lambda: None).result()
    w.tick(time.monotonic_ns())
    assert w.held == 4 and w.dropped == 6
    assert [r.request_id for r in w._held] == ["r6", "r7", "r8", "r9"]  # the newest kept
    w.close()
    assert w.unwritten == 10
