"""Importer round trips and content-derived structure: a trace exported to Mooncake JSONL
imports back with its block size (read from the hash ids' lengths) and the same hash ids,
and a file whose blocks cannot be told names --block-size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    rows = [
        {"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 129, "output_length": 1, "hash_ids": [1, 2, 3]},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert block_size_of([f]) == 64  # ceil(100/64) = 2, ceil(129/64) = 3; 128 gives 1 and 2
    rows[1]["hash_ids"] = [1, 2, 3, 4, 5]  # no block size fits both rows
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert block_size_of([f]) is None
    with pytest.raises(TraceError, match=r"give the file's block size with --block-size N$"):
        import_paths([f], "mooncake")


def test_taubench_row_waits_for_the_output_its_input_holds(tmp_path: Path) -> None:
    """taubench's shape (two LLMs under one session_id): the user simulator's prompt is
    rebuilt each turn (role-swapped), so it never extends its last input and starts a chain
    each time. Before: row 1 (its input is row 0's output, byte for byte) had no
    dependency and was sent before row 0 ended; now it waits for row 0."""
    sys_a, sys_u = "You are a helpful airline agent. " * 4, "You are a traveller. " * 4
    a1 = "Hello! How can I help you with your booking today?"
    u1 = "I want to change my flight to Friday, reservation ABC123."
    a2 = "Sure, let me look up reservation ABC123 for you right away."
    lines = [
        {"timestamp": 1_000_000, "input": sys_a, "output": a1, "session_id": "t"},
        {"timestamp": 2_000_000, "input": sys_u + a1, "output": u1, "session_id": "t"},
        {"timestamp": 3_000_000, "input": sys_a + a1 + u1, "output": a2, "session_id": "t"},
        {
            "timestamp": 4_000_000,
            "input": sys_u + "agent: " + a2,
            "output": "ok",
            "session_id": "t",
        },
    ]
    f = tmp_path / "taubench.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = import_paths([f], "lmcache")
    t = res.table.to_pydict()
    assert t["parent_index"] == [-1, -1, 0, -1]  # the agent's chain; each user turn starts anew
    assert t["depends_on"] == [None, [0], [0, 1], [2]]
    assert any(
        "3 rows wait for an earlier row whose output their input holds" in n for n in res.notes
    ), res.notes


@pytest.mark.shared_data
def test_real_miniswe_inputs_hold_no_earlier_output(shared_data: Path) -> None:
    """mini-swe-agent's inputs hold the non-assistant messages only: no content dependency
    may appear there (the rule finds forwarded outputs, not chance overlaps)."""
    for f in sorted((shared_data / "lmcache_agent_trace" / "miniswe").glob("*.jsonl"))[:3]:
        res = import_paths([f], "lmcache")
        assert res.table.column("depends_on").null_count == res.table.num_rows, f
        assert not any("wait for an earlier row" in n for n in res.notes)


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmcache"


def test_taubench_real_rows_first_reply_is_waited_for(tmp_path: Path) -> None:
    """Rows 0-1 of a real taubench session (cut byte for byte, fixtures/lmcache/README.md):
    row 1's input is row 0's output. Alone, neither chain continues, so nothing linked
    them before; row 1 now waits for row 0."""
    cut = tmp_path / "rows0-1.jsonl"
    cut.write_bytes(
        b"".join(
            (FIXTURES / "taubench-09867e5c-rows0-4.jsonl")
            .read_bytes()
            .splitlines(keepends=True)[:2]
        )
    )
    first, second = (json.loads(x) for x in cut.read_text().splitlines())
    assert second["input"] == first["output"]
    t = import_paths([cut], "lmcache").table.to_pydict()
    assert t["depends_on"] == [None, [0]] and t["parent_index"] == [-1, -1]


def _same_after_weka_round_trip(src: list[Path], tmp_path: Path) -> int:
    first, back, again = tmp_path / "a.parquet", tmp_path / "w.jsonl", tmp_path / "b.parquet"
    assert main(["traces", "import", *map(str, src), "-o", str(first)]) == 0
    assert main(["traces", "convert", str(first), "-o", str(back), "--to", "weka"]) == 0
    assert main(["traces", "import", str(back), "-o", str(again)]) == 0
    cols = ["session_id", "request_index", "agent_id", "depends_on", "input_tokens", "hash_ids"]
    a, b = pq.read_table(first).select(cols), pq.read_table(again).select(cols)
    assert a.to_pylist() == b.to_pylist()
    return a.num_rows


def test_a_weka_export_of_several_traces_round_trips_its_hash_ids(tmp_path: Path) -> None:
    """The k-th trace of an import has k << 40 added to its ids; the export wrote them with
    it and the re-import added it again (624 of 839 rows differed). The export now writes
    each trace's own ids."""
    from tests.traces.test_weka import weka_fixture

    def full_blocks(requests: list[dict[str, Any]]) -> None:  # as the format hashes them
        for r in requests:
            if "hash_ids" in r:
                r["hash_ids"] = r["hash_ids"][: r["in"] // 64]
            full_blocks(r.get("requests", []))

    files = []
    for k in range(3):
        trace = weka_fixture()
        trace["id"] = f"fx{k}"
        full_blocks(trace["requests"])
        f = tmp_path / f"fx{k}.json"
        f.write_text(json.dumps(trace))
        files.append(f)
    assert _same_after_weka_round_trip(files, tmp_path) > 0


@pytest.mark.shared_data
def test_the_real_weka_traces_round_trip(tmp_path: Path, shared_data: Path) -> None:
    assert _same_after_weka_round_trip([shared_data / "weka"], tmp_path) == 627
