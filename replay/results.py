"""The results folder: request rows written incrementally, and run.json.

Rows are buffered and flushed to ``requests/part-WWW-NNNNN.parquet`` every ``flush_rows``
rows or ``flush_s`` seconds (whichever first), each part written to a temporary name and
renamed, so a crash or Ctrl-C keeps every completed request in readable files. The
conversion to Arrow and the Parquet write run on a writer thread, off the measuring loop.
Times are stored as offsets from the run's t0 (agent_replay/results_schema.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.analysis.results import parquet_write_options
from agent_replay.errors import OutputError
from agent_replay.replay.affinity import helper_thread
from agent_replay.replay.journal import RowJournal
from agent_replay.replay.outcome import RequestRecord
from agent_replay.results_schema import REQUEST_SCHEMA

_SCALARS = (
    "session_id",
    "request_index",
    "parent_index",
    "clone",
    "worker",
    "request_id",
    "api",
    "warmup",
    "expected_input_tokens",
    "expected_output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "implied_cached_tokens",
    "status",
    "error_kind",
    "http_status",
    "error",
    "think_ns",
    "connect_ns",
    "agent_id",
    "depends_on",
)
_TIMES = ("intended_ns", "sent_ns", "headers_ns", "first_token_ns", "end_ns", "parent_end_ns")


def _chunk_arrays(
    recs: Sequence[RequestRecord], t0_ns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records' chunks as list offsets, chunk times (from ``t0_ns``) and token counts."""
    n = len(recs)
    offsets = np.zeros(n + 1, dtype=np.int32)
    lens = np.fromiter((len(r.chunk_ns) for r in recs), dtype=np.int32, count=n)
    np.cumsum(lens, out=offsets[1:])
    if not (n and offsets[-1]):
        return offsets, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    ns = np.frombuffer(b"".join(r.chunk_ns.tobytes() for r in recs), dtype=np.int64) - t0_ns
    tok = np.frombuffer(b"".join(r.chunk_tokens.tobytes() for r in recs), dtype=np.int32)
    return offsets, ns, tok


def records_to_table(recs: Sequence[RequestRecord], t0_ns: int) -> pa.Table:
    cols: dict[str, Any] = {}
    for name in _SCALARS:
        cols[name] = [getattr(r, name) for r in recs]
    for name in _TIMES:
        cols[name] = [None if (v := getattr(r, name)) is None else v - t0_ns for r in recs]
    offsets, ns, tok = _chunk_arrays(recs, t0_ns)
    cols["chunk_ns"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ns))
    cols["chunk_tokens"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tok))
    arrays = [
        pa.array(cols[f.name], type=f.type)
        if not isinstance(cols[f.name], pa.Array)
        else cols[f.name].cast(f.type)
        for f in REQUEST_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=REQUEST_SCHEMA)


class ResultWriter:
    """Buffers records of one worker and writes them as part files.

    A part that cannot be written (a full disk, say) loses no row: its rows are held in
    memory and written again, with the rows that came meanwhile, after a back-off that
    doubles from ``flush_s`` to ``MAX_BACKOFF_S``; past ``hold_bytes`` of held rows the
    oldest are dropped and counted. ``close`` writes what is left, retrying for
    ``retry_s``; then ``unwritten`` is the number of rows that have no part file and
    ``error`` the last write error. It never raises a write error.

    With ``journal`` (a worker process) each row also goes to the worker's row journal as
    it is added (``replay.journal``), so a kill loses only the requests in flight.

    Nothing else runs here: live statistics are computed by the dashboard's process from
    the part files (``analysis.live.PartsFeed``), off the measuring process.
    """

    MAX_BACKOFF_S = 8.0

    def __init__(
        self,
        folder: Path,
        t0_ns: int,
        worker: int = 0,
        *,
        flush_rows: int = 2000,
        flush_s: float = 1.0,
        retry_s: float = 10.0,
        hold_bytes: int = 256 << 20,
        journal: bool = False,
    ) -> None:
        self.dir = folder / "requests"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = t0_ns
        self.worker = worker
        self.flush_rows = flush_rows
        self.flush_ns = int(flush_s * 1e9)
        self.retry_s = retry_s
        self.hold_bytes = hold_bytes
        self._buf: list[RequestRecord] = []
        self._seq = 0
        self._last_flush_ns: int | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="results", initializer=helper_thread
        )
        self._pending: list[tuple[Future[BaseException | None], list[RequestRecord], int]] = []
        # a worker process's rows also go to its journal as they come (replay.journal)
        self.journal = RowJournal(self.dir, worker) if journal else None
        self._held: list[RequestRecord] = []  # rows of failed writes, oldest first
        self._held_bytes = 0
        self._retry_at_ns = 0
        self._backoff_ns = self.flush_ns
        self._lock = threading.Lock()
        self.rows = 0  # rows added
        self.written = 0  # rows in part files
        self.dropped = 0  # rows let go past hold_bytes
        self.error: str | None = None  # the last write error
        self.failing = False  # the last write failed
        self.unwritten = 0  # after close: rows without a part file
        self.parts: list[Path] = []

    def warm(self) -> None:
        """Start the writer thread and run one conversion and one Parquet write (to memory)
        on it now, before the run. The first of each in a process does one-off set-up, part
        of it holding the GIL: left to the first flush, it lands inside the run, on the
        measuring loop (benchmarks/journal/2026-11-30-workers-on-one-host.md)."""
        self._pool.submit(self._warm).result()

    def _warm(self) -> None:
        rec = RequestRecord(
            session_id="",
            request_index=0,
            parent_index=-1,
            clone=0,
            worker=self.worker,
            request_id="",
            api="completions",
            expected_input_tokens=1,
            expected_output_tokens=1,
            implied_cached_tokens=None,
        )
        rec.intended_ns = rec.sent_ns = rec.first_token_ns = rec.end_ns = self.t0
        rec.chunk_ns.append(self.t0)
        rec.chunk_tokens.append(1)
        pq.write_table(
            records_to_table([rec], self.t0), pa.BufferOutputStream(), **parquet_write_options()
        )

    def add(self, rec: RequestRecord) -> None:
        self.rows += 1
        self._buf.append(rec)
        if self.journal is not None:
            self.journal.append(rec)
        if len(self._buf) >= self.flush_rows:
            self.flush()

    def tick(self, now_ns: int) -> None:
        """Flush when the buffer is older than ``flush_s`` (called periodically)."""
        if self._last_flush_ns is None:
            self._last_flush_ns = now_ns
        self._harvest()
        if (self._buf or self._held) and now_ns - self._last_flush_ns >= self.flush_ns:
            self.flush(now_ns)
            self._last_flush_ns = now_ns

    @property
    def held(self) -> int:
        """While writes fail: the rows waiting in memory (held, buffered or being retried)."""
        if not self.failing:
            return 0
        return len(self._held) + len(self._buf) + sum(len(b) for _, b, _ in self._pending)

    def flush(self, now_ns: int | None = None) -> None:
        """Hand the buffered rows (and any held ones, once the back-off is over) to the
        writer thread."""
        self._harvest()
        if self._held:
            now = time.monotonic_ns() if now_ns is None else now_ns
            if now < self._retry_at_ns:
                self._bound()
                return
            self._buf, self._held, self._held_bytes = self._held + self._buf, [], 0
        if not self._buf:
            return
        batch, self._buf = self._buf, []
        name = f"part-{self.worker:03d}-{self._seq:05d}.parquet"
        self._seq += 1
        seg = self.journal.cut() if self.journal is not None else 0
        self._pending.append((self._pool.submit(self._write, batch, self.dir / name), batch, seg))

    def _harvest(self) -> None:
        """Look at the writes that finished: count the written rows, hold the failed ones."""
        if not self._pending:
            return
        still = []
        for fut, batch, seg in self._pending:
            if not fut.done():
                still.append((fut, batch, seg))
                continue
            self._settle(fut.result(), batch, seg)
        self._pending = still

    def _settle(self, err: BaseException | None, batch: list[RequestRecord], seg: int) -> None:
        if err is None:
            self.written += len(batch)
            if self.journal is not None:  # a batch of held rows leaves their segments to close
                self.journal.written(seg)
            self.failing = False
            self._backoff_ns = self.flush_ns
            return
        self.failing = True
        self.error = _why(err)
        self._held.extend(batch)
        self._held_bytes += sum(_row_bytes(r) for r in batch)
        self._retry_at_ns = time.monotonic_ns() + self._backoff_ns
        self._backoff_ns = min(2 * self._backoff_ns, int(self.MAX_BACKOFF_S * 1e9))
        self._bound()

    def _bound(self) -> None:
        """Drop the oldest held rows past ``hold_bytes`` (counted in ``dropped``)."""
        while self._held and self._held_bytes > self.hold_bytes:
            rec = self._held.pop(0)
            self._held_bytes -= _row_bytes(rec)
            self.dropped += 1

    def _write(self, batch: list[RequestRecord], dest: Path) -> BaseException | None:
        """Write one part (to a hidden temporary name, then renamed): None, or the error
        that stopped it (its temporary file removed)."""
        tmp = dest.with_name(f".{dest.name}.tmp")
        try:
            table = records_to_table(batch, self.t0)
            pq.write_table(table, tmp, **parquet_write_options())  # zstd, delta-coded chunk times
            os.replace(tmp, dest)
        except Exception as exc:  # the rows are kept; the error is reported
            with contextlib.suppress(OSError):
                tmp.unlink()
            return exc
        with self._lock:
            self.parts.append(dest)
        return None

    def close(self) -> None:
        """Write what is left, retrying failed writes for ``retry_s`` with the back-off,
        then set ``unwritten``. Never raises a write error."""
        self.flush()
        deadline = time.monotonic_ns() + int(self.retry_s * 1e9)
        while True:
            for fut, batch, seg in self._pending:
                self._settle(fut.result(), batch, seg)
            self._pending = []
            if not self._held and not self._buf:
                break
            now = time.monotonic_ns()
            if now >= deadline:
                break
            time.sleep(max(0.0, min(self._retry_at_ns, deadline) - now) / 1e9)
            self._retry_at_ns = 0
            self.flush()
        self._pool.shutdown(wait=True)
        self.unwritten = len(self._held) + len(self._buf) + self.dropped
        if self.journal is not None:  # every row is in a part file or counted in unwritten
            self.journal.close()


def _why(err: BaseException) -> str:
    """A write error in a few words: the system's text for its errno (pyarrow wraps it in
    longer prose), else the exception."""
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno)
    return f"{type(err).__name__}: {err}"


def _row_bytes(rec: RequestRecord) -> int:
    """About what a held row costs in memory: the object and its chunk arrays."""
    return 600 + 12 * len(rec.chunk_ns)


def remove_unfinished_parts(folder: Path) -> int:
    """Remove the temporary part files (``requests/.part-*.tmp``) that a worker killed while
    writing left behind (readers never take them: they read ``part-*.parquet`` only);
    returns how many."""
    n = 0
    for f in (folder / "requests").glob(".part-*.tmp"):
        with contextlib.suppress(OSError):
            f.unlink()
            n += 1
    return n


class SpaceReserve:
    """A hidden file of ``size`` bytes in the results folder, written when the folder is
    made, so that run.json's last write has room on a disk that filled up during the run:
    ``release`` (when that write finds no space, and at the run's end) removes it."""

    NAME = ".space-reserve"

    def __init__(self, folder: Path, size: int = 512 << 10) -> None:
        self.path = folder / self.NAME
        try:
            with open(self.path, "wb") as f:
                try:
                    os.posix_fallocate(f.fileno(), 0, size)
                except (AttributeError, OSError) as exc:  # not Linux, or a file system without it
                    if isinstance(exc, OSError) and exc.errno not in (
                        errno.EOPNOTSUPP,
                        errno.EINVAL,
                    ):
                        raise
                    f.write(b"\0" * size)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise OutputError(
                f"{folder}: cannot write the results: {exc.strerror or exc}"
            ) from None

    def release(self) -> bool:
        """Remove the file; whether there was one to remove."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
