"""Recorded rows on their way to disk: a buffer, and part files written atomically.

A recording is a trace folder of ``part-NNNNN.parquet`` files, each written whole through
``traces.io.write_trace`` (temporary file, then rename), so a reader never sees half a
file and a killed recorder loses at most the rows of its last flush interval.

Besides the trace schema's columns, a recorded row has these extra columns (readers keep
unknown columns):

========================  =====================================================
``error``                 why the request failed (None when it did not)
``http_status``           the upstream's status code (0 when none arrived)
``stream``                the response was an event stream
``upstream_send_ns``      when the proxy started the upstream request, from arrival
``headers_ns``            when the upstream's response headers arrived, from arrival
``exact_chunk_tokens``    ``chunk_tokens`` is exact (token ids / continuous usage)
``undecoded_body``        why the request body (Content-Encoding) was not decoded:
                          forwarded as sent, recorded without content or hash ids
========================  =====================================================
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from agent_replay.errors import OutputExistsError
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TRACE_SCHEMA, TraceMeta

EXTRA_FIELDS = [
    pa.field("error", pa.string()),
    pa.field("http_status", pa.int32()),
    pa.field("stream", pa.bool_()),
    pa.field("upstream_send_ns", pa.int64()),
    pa.field("headers_ns", pa.int64()),
    pa.field("exact_chunk_tokens", pa.bool_()),
    pa.field("undecoded_body", pa.string()),
]
RECORD_SCHEMA = pa.schema(list(TRACE_SCHEMA) + EXTRA_FIELDS)
_PART = re.compile(r"^part-(\d{5,})\.parquet$")


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by column name; missing keys are null) as a table. ``hash_ids``
    may be an int64 array (a big body's, ``BodyDigest.ids``)."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in RECORD_SCHEMA}
    arrays = []
    for f in RECORD_SCHEMA:
        if f.name == "hash_ids" and any(isinstance(v, np.ndarray) for v in cols[f.name]):
            arrays.append(_int64_lists(cols[f.name]))
        elif pa.types.is_dictionary(f.type):
            arrays.append(pa.array(cols[f.name], type=pa.string()).dictionary_encode().cast(f.type))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _int64_lists(values: list[Any]) -> pa.ListArray:
    """A list<int64> column of lists, int64 arrays and None, its values gathered by NumPy:
    a copy that runs without the GIL, where Arrow's conversion of an array inside a list
    holds it, and with it the proxy's loop, for as long as the copy takes (on a fresh
    page of memory, up to 100 ms for a 30 MB body's 117,000 ids)."""
    lengths = np.array([0 if v is None else len(v) for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    parts = [np.asarray(v, dtype=np.int64) for v in values if v is not None]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(flat), mask=pa.array([v is None for v in values])
    )


def yield_cpu(min_gap_ns: int = 0) -> None:
    """Let a thread waiting for this CPU run now (``os.sched_yield``; the GIL is released
    meanwhile). A flush in a worker thread calls it between its steps: on the event
    loop's CPU the kernel would otherwise let the flush run out its time slice (a few ms)
    before the woken loop gets the CPU.

    With ``min_gap_ns``, only when the last yield is at least that long ago. Each yield can
    cost the flush a whole time slice while another process keeps the CPU busy, so a step
    repeated per row yields at most once per ``min_gap_ns``: the flush keeps up with its
    interval on a contended CPU, and a kill loses no more than that interval of rows."""
    global _last_yield_ns
    if _sched_yield is None:
        return
    if min_gap_ns and time.monotonic_ns() - _last_yield_ns < min_gap_ns:
        return
    _sched_yield()
    _last_yield_ns = time.monotonic_ns()


ROW_YIELD_GAP_NS = 1_000_000
"""The least time between two yields of a flush's per-row steps (``yield_cpu``)."""
_last_yield_ns = 0
_sched_yield = getattr(os, "sched_yield", None)


class PartWriter:
    """Writes part files into ``out_dir``. An existing folder must hold no part files
    unless ``force``, which deletes them first."""

    def __init__(self, out_dir: str | os.PathLike[str], *, force: bool = False) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise OutputExistsError(str(self.out_dir))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        existing = [
            p
            for p in self.out_dir.iterdir()
            if p.suffix == ".parquet" and not p.name.startswith(".")
        ]
        if existing:
            if not force:
                raise OutputExistsError(str(self.out_dir))
            for p in existing:
                p.unlink()
        # Arrow loads its cast kernels on first use (100-300 ms, most of it holding the
        # GIL): here, before the proxy serves, not in the first flush while streams run
        rows_to_table([])
        self.next_part = 1
        self.parts: list[Path] = []
        self.rows_written = 0

    def write(self, rows: list[dict[str, Any]], meta: TraceMeta) -> Path:
        """Write ``rows`` as the next part. Meant for a background thread: it gives up
        its CPU between stages (``yield_cpu``)."""
        path = self.out_dir / f"part-{self.next_part:05d}.parquet"
        table = rows_to_table(rows)
        yield_cpu()
        write_trace(table, path, meta, between=yield_cpu)
        self.next_part += 1
        self.parts.append(path)
        self.rows_written += len(rows)
        return path
