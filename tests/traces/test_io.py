from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.errors import OutputExistsError
from agent_replay.traces import (
    SCHEMA_VERSION,
    TraceError,
    TraceMeta,
    iter_batches,
    read_meta,
    read_trace,
    write_trace,
)
from agent_replay.traces.schema import METADATA_KEY


def small_table(n: int = 5) -> pa.Table:
    return pa.table(
        {
            "session_id": ["s0"] * n,
            "request_index": list(range(n)),
            "parent_index": [-1] + list(range(n - 1)),
            "arrival_ns": [i * 1_000_000 for i in range(n)],
            "input_tokens": [100 + i for i in range(n)],
            "output_tokens": [10] * n,
            "hash_ids": [[1, 2]] * n,
            "my_extra": ["x"] * n,
        }
    )


def test_roundtrip_keeps_metadata_and_extra_columns(tmp_path: Path) -> None:
    dest = write_trace(
        small_table(), tmp_path / "t.parquet", TraceMeta(block_size=16, source="recorded")
    )
    table, meta = read_trace(dest)
    assert (
        meta.block_size == 16
        and meta.source == "recorded"
        and meta.schema_version == SCHEMA_VERSION
    )
    assert table.num_rows == 5
    assert table.column("my_extra").to_pylist() == ["x"] * 5
    assert table.column("think_ns").null_count == 5  # missing nullable column added as nulls
    assert not list(tmp_path.glob(".*tmp"))


def test_refuses_overwrite_without_force(tmp_path: Path) -> None:
    dest = write_trace(small_table(), tmp_path / "t.parquet", TraceMeta())
    before = dest.read_bytes()
    with pytest.raises(OutputExistsError):
        write_trace(small_table(2), dest, TraceMeta())
    assert dest.read_bytes() == before
    write_trace(small_table(2), dest, TraceMeta(), force=True)
    assert read_trace(dest)[0].num_rows == 2


def test_folder_of_parts_projection_and_batches(tmp_path: Path) -> None:
    write_trace(small_table(3), tmp_path / "part-0000.parquet", TraceMeta())
    write_trace(small_table(4), tmp_path / "part-0001.parquet", TraceMeta())
    table, _ = read_trace(tmp_path, columns=["session_id", "input_tokens"])
    assert table.num_rows == 7 and table.column_names == ["session_id", "input_tokens"]
    rows = sum(b.num_rows for b in iter_batches(tmp_path, ["arrival_ns"], batch_size=2))
    assert rows == 7


def test_newer_schema_version_is_refused_with_a_reason(tmp_path: Path) -> None:
    dest = write_trace(
        small_table(), tmp_path / "t.parquet", TraceMeta(schema_version=SCHEMA_VERSION + 1)
    )
    with pytest.raises(TraceError, match=rf"t\.parquet.*schema v{SCHEMA_VERSION + 1}.*upgrade"):
        read_meta(dest)


def test_missing_required_column_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="'output_tokens'"):
        write_trace(
            small_table().drop_columns(["output_tokens"]), tmp_path / "t.parquet", TraceMeta()
        )
    assert not (tmp_path / "t.parquet").exists()


def test_garbage_and_foreign_parquet_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match="bad.parquet"):
        read_meta(bad)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with pytest.raises(TraceError, match="not an agent-replay trace"):
        read_meta(foreign)
    assert METADATA_KEY  # the key is bytes, stable
