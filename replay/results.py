"""The results folder: request rows written incrementally, and run.json.

Rows are buffered and flushed to ``requests/part-WWW-NNNNN.parquet`` every ``flush_rows``
rows or ``flush_s`` seconds (whichever first), each part written to a temporary name and
renamed, so a crash or Ctrl-C keeps every completed request in readable files. The
conversion to Arrow and the Parquet write run on a writer thread, off the measuring loop.
Times are stored as offsets from the run's t0 (agent_replay/results_schema.py).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.analysis.results import parquet_write_options
from agent_replay.errors import InputError, OutputExistsError
from agent_replay.replay.affinity import helper_thread
from agent_replay.replay.outcome import RequestRecord
from agent_replay.results_schema import REQUEST_SCHEMA

_SCALARS = (
    "session_id", "request_index", "parent_index", "clone", "worker", "request_id", "api",
    "warmup", "expected_input_tokens", "expected_output_tokens", "prompt_tokens",
    "completion_tokens", "cached_tokens", "implied_cached_tokens", "status", "error_kind",
    "http_status", "error", "think_ns", "connect_ns", "agent_id", "depends_on",
)
_TIMES = ("intended_ns", "sent_ns", "headers_ns", "first_token_ns", "end_ns", "parent_end_ns")


def prepare_folder(path: Path, force: bool) -> None:
    """Create a fresh results folder. An existing non-empty one is replaced only with
    ``force``, and only when it looks like a results folder (so a typo cannot wipe an
    unrelated directory)."""
    if path.exists():
        if not path.is_dir():
            raise OutputExistsError(str(path)) if not force else InputError(
                f"{path}: exists and is not a results folder; remove it yourself")
        entries = list(path.iterdir())
        if entries:
            if not force:
                raise OutputExistsError(str(path))
            if not (path / "run.json").exists() and not (path / "requests").is_dir():
                raise InputError(f"{path}: not a results folder (no run.json); refusing to "
                                 "overwrite it even with --force")
            shutil.rmtree(path)
    (path / "requests").mkdir(parents=True, exist_ok=True)


def records_to_table(recs: Sequence[RequestRecord], t0_ns: int) -> pa.Table:
    n = len(recs)
    cols: dict[str, Any] = {}
    for name in _SCALARS:
        cols[name] = [getattr(r, name) for r in recs]
    for name in _TIMES:
        cols[name] = [None if (v := getattr(r, name)) is None else v - t0_ns for r in recs]
    offsets = np.zeros(n + 1, dtype=np.int32)
    lens = np.fromiter((len(r.chunk_ns) for r in recs), dtype=np.int32, count=n)
    np.cumsum(lens, out=offsets[1:])
    if n and offsets[-1]:
        ns = np.frombuffer(b"".join(r.chunk_ns.tobytes() for r in recs), dtype=np.int64) - t0_ns
        tok = np.frombuffer(b"".join(r.chunk_tokens.tobytes() for r in recs), dtype=np.int32)
    else:
        ns = np.zeros(0, dtype=np.int64)
        tok = np.zeros(0, dtype=np.int32)
    cols["chunk_ns"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ns))
    cols["chunk_tokens"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tok))
    arrays = [pa.array(cols[f.name], type=f.type) if not isinstance(cols[f.name], pa.Array)
              else cols[f.name].cast(f.type) for f in REQUEST_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=REQUEST_SCHEMA)


class ResultWriter:
    """Buffers records of one worker and writes them as part files.

    Nothing else runs here: live statistics are computed by the dashboard's process from
    the part files (``analysis.live.PartsFeed``), off the measuring process.
    """

    def __init__(self, folder: Path, t0_ns: int, worker: int = 0, *, flush_rows: int = 2000,
                 flush_s: float = 1.0) -> None:
        self.dir = folder / "requests"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = t0_ns
        self.worker = worker
        self.flush_rows = flush_rows
        self.flush_ns = int(flush_s * 1e9)
        self._buf: list[RequestRecord] = []
        self._seq = 0
        self._last_flush_ns: int | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="results",
                                        initializer=helper_thread)
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self.rows = 0
        self.parts: list[Path] = []

    def warm(self) -> None:
        """Start the writer thread and run one conversion and one Parquet write (to memory)
        on it now, before the run. The first of each in a process does one-off set-up, part
        of it holding the GIL: left to the first flush, it lands inside the run, on the
        measuring loop (benchmarks/journal/2026-11-30-workers-on-one-host.md)."""
        self._pool.submit(self._warm).result()

    def _warm(self) -> None:
        rec = RequestRecord(session_id="", request_index=0, parent_index=-1, clone=0, worker=self.worker,
                            request_id="", api="completions", expected_input_tokens=1,
                            expected_output_tokens=1, implied_cached_tokens=None)
        rec.intended_ns = rec.sent_ns = rec.first_token_ns = rec.end_ns = self.t0
        rec.chunk_ns.append(self.t0)
        rec.chunk_tokens.append(1)
        pq.write_table(records_to_table([rec], self.t0), pa.BufferOutputStream(), **parquet_write_options())

    def add(self, rec: RequestRecord) -> None:
        self._buf.append(rec)
        if len(self._buf) >= self.flush_rows:
            self.flush()

    def tick(self, now_ns: int) -> None:
        """Flush when the buffer is older than ``flush_s`` (called periodically)."""
        if self._last_flush_ns is None:
            self._last_flush_ns = now_ns
        if self._buf and now_ns - self._last_flush_ns >= self.flush_ns:
            self.flush()
            self._last_flush_ns = now_ns

    def flush(self) -> None:
        if not self._buf:
            return
        batch, self._buf = self._buf, []
        name = f"part-{self.worker:03d}-{self._seq:05d}.parquet"
        self._seq += 1
        self.rows += len(batch)
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._write, batch, self.dir / name))

    def _write(self, batch: list[RequestRecord], dest: Path) -> None:
        table = records_to_table(batch, self.t0)
        tmp = dest.with_name(f".{dest.name}.tmp")
        pq.write_table(table, tmp, **parquet_write_options())  # zstd, delta-coded chunk times
        os.replace(tmp, dest)
        with self._lock:
            self.parts.append(dest)

    def close(self) -> None:
        """Flush what is left and wait for every part file (raises a write error)."""
        self.flush()
        self._pool.shutdown(wait=True)
        for f in self._pending:
            f.result()


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
