"""A worker's row journal: every completed request appended to a file the moment it is
recorded, so that a worker killed outright (``kill -9``) loses only the requests it had in
flight, not the rows it had buffered for its next part file.

A part file is written every second or so (``results.ResultWriter``); in between, the rows
live in the worker's memory. The journal keeps a copy where the kernel holds it: one
``write`` per row to ``requests/.rows-WWW-SSSSS.journal``, which survives the process
(not the machine). A segment covers the rows of one part file: the writer starts the next
segment when it hands a batch to its thread (``cut``) and removes a segment once its part
file is written (``written``); a clean close removes them all. What a killed worker leaves,
its parent turns into a part file (``recover``), leaving out rows already in a part.

A row is a header of three little-endian u32 lengths, then the scalar fields as a JSON
array (``FIELDS``'s order) and the chunk arrays' raw bytes. A row cut by the kill (a
short last write) is left out.
"""

from __future__ import annotations

import contextlib
import os
import struct
from array import array
from operator import attrgetter
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from agent_replay.analysis.results import parquet_write_options
from agent_replay.replay.outcome import RequestRecord

FIELDS = (
    "session_id",
    "request_index",
    "parent_index",
    "clone",
    "worker",
    "request_id",
    "api",
    "expected_input_tokens",
    "expected_output_tokens",
    "implied_cached_tokens",
    "warmup",
    "intended_ns",
    "sent_ns",
    "connect_ns",
    "headers_ns",
    "first_token_ns",
    "end_ns",
    "parent_end_ns",
    "agent_id",
    "depends_on",
    "think_ns",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "status",
    "error_kind",
    "http_status",
    "error",
)
_INIT = FIELDS[:10]  # RequestRecord's constructor arguments
_VALUES = attrgetter(*FIELDS)
_HEAD = struct.Struct("<III")


def segment_path(folder: Path, worker: int, seg: int) -> Path:
    """Segment ``seg`` of worker ``worker``'s journal in ``folder`` (the ``requests`` folder)."""
    return folder / f".rows-{worker:03d}-{seg:05d}.journal"


def encode(rec: RequestRecord) -> bytes:
    head = orjson.dumps(_VALUES(rec))
    ns, tok = rec.chunk_ns.tobytes(), rec.chunk_tokens.tobytes()
    return b"".join((_HEAD.pack(len(head), len(ns), len(tok)), head, ns, tok))


def decode(data: bytes) -> list[RequestRecord]:
    """The whole rows in ``data`` (a segment's bytes); a short last row is left out."""
    out = []
    pos, end = 0, len(data)
    while pos + _HEAD.size <= end:
        nh, nn, nt = _HEAD.unpack_from(data, pos)
        body = pos + _HEAD.size
        if body + nh + nn + nt > end:
            break
        values = orjson.loads(data[body : body + nh])
        rec = RequestRecord(**dict(zip(_INIT, values[: len(_INIT)], strict=True)))
        for name, v in zip(FIELDS[len(_INIT) :], values[len(_INIT) :], strict=True):
            setattr(rec, name, v)
        rec.chunk_ns = array("q", data[body + nh : body + nh + nn])
        rec.chunk_tokens = array("i", data[body + nh + nn : body + nh + nn + nt])
        out.append(rec)
        pos = body + nh + nn + nt
    return out


class RowJournal:
    """Worker ``worker``'s journal in ``folder`` (its ``requests`` folder). A write that
    fails (a full disk) turns the journal off for the rest of the run: the part files
    remain the record; ``failed`` says so."""

    def __init__(self, folder: Path, worker: int) -> None:
        self.folder = folder
        self.worker = worker
        self.seg = 0
        self._fd: int | None = None
        self._open: set[int] = set()  # segments on disk
        self.failed: str | None = None

    def append(self, rec: RequestRecord) -> None:
        if self.failed is not None:
            return
        try:
            if self._fd is None:
                path = segment_path(self.folder, self.worker, self.seg)
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._open.add(self.seg)
            os.write(self._fd, encode(rec))
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
            self._close_fd()

    def cut(self) -> int:
        """End the current segment (its rows go into the part file being handed to the
        writer thread) and return its number; the next row starts a new one."""
        self._close_fd()
        seg, self.seg = self.seg, self.seg + 1
        return seg

    def written(self, seg: int) -> None:
        """Segment ``seg``'s part file was written: the segment goes."""
        if seg in self._open:
            self._open.discard(seg)
            with contextlib.suppress(OSError):
                segment_path(self.folder, self.worker, seg).unlink()

    def close(self) -> None:
        """The worker's writer closed (every row in a part file or counted as unwritten):
        every segment goes."""
        self._close_fd()
        for seg in sorted(self._open):
            self.written(seg)

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def recover(folder: Path, worker: int, t0_ns: int) -> int:
    """Worker ``worker``'s journal segments in ``folder`` (the results folder) turned into
    ``requests/part-WWW-recovered.parquet``: the rows that no part file of the worker has.
    The segments are removed. Returns how many rows were recovered."""
    from agent_replay.replay.results import records_to_table

    req = folder / "requests"
    segs = sorted(req.glob(f".rows-{worker:03d}-*.journal"))
    if not segs:
        return 0
    have: set[str] = set()
    for f in sorted(req.glob(f"part-{worker:03d}-*.parquet")):
        with contextlib.suppress(OSError, ValueError):
            have.update(pq.read_table(f, columns=["request_id"]).column(0).to_pylist())
    rows: dict[str, RequestRecord] = {}
    for f in segs:
        with contextlib.suppress(OSError):
            for rec in decode(f.read_bytes()):
                if rec.request_id not in have:
                    rows[rec.request_id] = rec
    if rows:
        dest = req / f"part-{worker:03d}-recovered.parquet"
        tmp = dest.with_name(f".{dest.name}.tmp")
        pq.write_table(records_to_table(list(rows.values()), t0_ns), tmp, **parquet_write_options())
        os.replace(tmp, dest)
    for f in segs:
        with contextlib.suppress(OSError):
            f.unlink()
    return len(rows)
