"""Hostile traces for the reader's limits: files of a few kilobytes that claim, or decode
to, gigabytes. Written without ever holding the decoded data (a dictionary array with one
long value, run-length-friendly lists), so making them costs megabytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.traces.schema import METADATA_KEY, TraceMeta


def _base(n: int, sessions: int = 1) -> dict[str, pa.Array]:
    """Every column ``traces inspect`` reads."""
    sid = np.arange(n) % sessions
    return {
        "session_id": pa.array([f"s{i}" for i in sid]),
        "request_index": pa.array(np.arange(n) // sessions, pa.int32()),
        "parent_index": pa.array(np.arange(n) // sessions - 1, pa.int32()),
        "arrival_ns": pa.array(np.arange(n, dtype=np.int64) * 1000),
        "think_ns": pa.nulls(n, pa.int64()),
        "input_tokens": pa.array(np.full(n, 16), pa.int32()),
        "output_tokens": pa.array(np.full(n, 4), pa.int32()),
        "cached_tokens": pa.nulls(n, pa.int32()),
        "hash_ids": pa.nulls(n, pa.list_(pa.int64())),
        "model": pa.array(["m"] * n),
    }


def _write(path: Path, cols: dict[str, pa.Array], *, store_schema: bool = True) -> Path:
    meta = TraceMeta(block_size=16, source="synthetic")
    table = pa.table(cols).replace_schema_metadata({METADATA_KEY: meta.to_bytes()})
    with pq.ParquetWriter(path, table.schema, compression="zstd", store_schema=store_schema) as w:
        w.write_table(table)
        w.add_key_value_metadata({METADATA_KEY: meta.to_bytes()})
    return path


def string_bomb(path: Path, rows: int = 9000, value_bytes: int = 1 << 20) -> Path:
    """A ``content`` column whose one dictionary value (``value_bytes`` of 'x') is on every
    row: ``rows * value_bytes`` decoded, a few kilobytes on disk. Written without the
    Arrow schema, so a plain reader decodes it to strings."""
    cols = _base(rows)
    cols["content"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(rows, np.int32)), pa.array(["x" * value_bytes])
    )
    return _write(path, cols, store_schema=False)


def name_bomb(path: Path, rows: int = 5000, value_bytes: int = 1 << 20) -> Path:
    """A dictionary-encoded ``model`` name of ``value_bytes`` on every row."""
    cols = _base(rows)
    cols["model"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(rows, np.int32)), pa.array(["m" * value_bytes])
    )
    return _write(path, cols)


def long_name(path: Path, rows: int = 5000, value_bytes: int = 1 << 20) -> Path:
    """The ``session_id`` of every row one plain string of ``value_bytes`` (a dictionary
    page on disk; written without the Arrow schema, so it reads as plain strings)."""
    cols = _base(rows)
    cols["session_id"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(rows, np.int32)), pa.array(["s" * value_bytes])
    )
    return _write(path, cols, store_schema=False)


def list_bomb(path: Path, length: int = 11_000_000) -> Path:
    """One row whose ``hash_ids`` list has ``length`` equal values (run-length encoded)."""
    cols = _base(1)
    cols["hash_ids"] = pa.ListArray.from_arrays(
        pa.array([0, length], pa.int32()), pa.array(np.zeros(length, np.int64))
    )
    return _write(path, cols)


def nan_arrival(path: Path, rows: int = 10, bad_row: int = 7) -> Path:
    """``arrival_ns`` as doubles, one of them NaN."""
    cols = _base(rows)
    arr = np.arange(rows, dtype=np.float64) * 1000
    arr[bad_row] = np.nan
    cols["arrival_ns"] = pa.array(arr)
    return _write(path, cols)


def many_rows(path: Path, rows: int, sessions: int) -> Path:
    """A valid trace of ``rows`` tiny requests over ``sessions`` sessions, row groups of
    64K rows."""
    meta = TraceMeta(block_size=16, source="synthetic")
    sid = np.arange(rows) % sessions
    table = pa.table(
        {
            "session_id": pa.array(sid.astype(str)).dictionary_encode(),
            "request_index": pa.array(np.arange(rows) // sessions, pa.int32()),
            "parent_index": pa.array(np.arange(rows) // sessions - 1, pa.int32()),
            "arrival_ns": pa.array(np.arange(rows, dtype=np.int64) * 1000),
            "input_tokens": pa.array(np.full(rows, 16), pa.int32()),
            "output_tokens": pa.array(np.full(rows, 1), pa.int32()),
        }
    ).replace_schema_metadata({METADATA_KEY: meta.to_bytes()})
    pq.write_table(table, path, compression="zstd", row_group_size=65536)
    return path
