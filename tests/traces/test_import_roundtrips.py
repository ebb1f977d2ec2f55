"""Importer round trips and content-derived structure: a trace exported to Mooncake JSONL
imports back with its block size (read from the hash ids' lengths) and the same hash ids,
and a file whose blocks cannot be told names --block-size."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.errors import TraceError
from agent_replay.replay.cli import main
from agent_replay.traces.importers import import_paths
from agent_replay.traces.importers.mooncake import block_size_of

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "samples" / "agent-small.parquet"


def test_a_jsonl_export_imports_back_with_its_block_size(tmp_path: Path) -> None:
    """Before: "row 0, field 'hash_ids': length differs from ceil(input_tokens / 512)", with
    no word of --block-size; after: the file's blocks (16 tokens) are read from it."""
    jl, back = tmp_path / "t.jsonl", tmp_path / "back.parquet"
    assert main(["traces", "convert", str(SAMPLE), "-o", str(jl)]) == 0
    assert main(["traces", "import", str(jl), "-o", str(back)]) == 0
    src, got = pq.read_table(SAMPLE), pq.read_table(back)
    assert got.column("hash_ids").to_pylist() == src.column("hash_ids").to_pylist()
    assert got.column("input_tokens").to_pylist() == src.column("input_tokens").to_pylist()
    from agent_replay.traces.io import read_trace

    block = read_trace(SAMPLE)[1].block_size
    assert import_paths([jl], "mooncake").meta.block_size == block == 16


def test_block_size_by_hand(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    rows = [{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1, 2]},
            {"timestamp": 1, "input_length": 129, "output_length": 1, "hash_ids": [1, 2, 3]}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert block_size_of([f]) == 64  # ceil(100/64) = 2, ceil(129/64) = 3; 128 gives 1 and 2
    rows[1]["hash_ids"] = [1, 2, 3, 4, 5]  # no block size fits both rows
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert block_size_of([f]) is None
    with pytest.raises(TraceError, match=r"give the file's block size with --block-size N$"):
        import_paths([f], "mooncake")
