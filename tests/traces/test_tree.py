"""Schema v2 agent trees: v1 defaults, the DAG validator, dependency derivation."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.traces.io import conform, read_trace, write_trace
from agent_replay.traces.schema import METADATA_KEY, TraceMeta
from agent_replay.traces.tree import derive_depends_on, think_after, tree_columns
from agent_replay.traces.validate import validate


def v2(agent: list[str | None], deps: list[list[int] | None], **cols: list[object]) -> pa.Table:
    n = len(agent)
    base: dict[str, object] = {
        "session_id": ["s"] * n,
        "request_index": list(range(n)),
        "parent_index": [-1] + list(range(n - 1)),
        "arrival_ns": list(range(n)),
        "input_tokens": [16] * n,
        "output_tokens": [1] * n,
        "agent_id": pa.array(agent, pa.string()),
        "depends_on": pa.array(deps, pa.list_(pa.int32())),
    }
    base.update(cols)
    return conform(pa.table(base))


def messages(t: pa.Table) -> list[str]:
    return [f"{p.row}:{p.field}:{p.message}" for p in validate(t, TraceMeta(block_size=16))]


def test_v1_file_reads_with_derived_tree_columns(tmp_path: Path) -> None:
    # a file as a v1 writer left it: no agent_id / depends_on columns, schema_version 1
    v1 = pa.table(
        {
            "session_id": ["a", "a", "a", "b"],
            "request_index": [0, 1, 2, 0],
            "parent_index": [-1, 0, 0, -1],
            "arrival_ns": [0, 5, 9, 1],
            "input_tokens": [16, 32, 32, 16],
            "output_tokens": [1, 1, 1, 1],
        }
    )
    meta = TraceMeta(schema_version=1, block_size=16)
    path = tmp_path / "v1.parquet"
    v1 = conform(v1).drop_columns(["agent_id", "depends_on"])
    pq.write_table(v1.replace_schema_metadata({METADATA_KEY: meta.to_bytes()}), path)
    table, got = read_trace(path)
    assert got.schema_version == 1 and "depends_on" not in table.column_names
    t = tree_columns(table)
    assert t.column("agent_id").to_pylist() == ["main"] * 4
    assert t.column("depends_on").to_pylist() == [[], [0], [0], []]
    assert messages(table) == []


def test_null_rows_get_v1_meaning_and_set_rows_are_kept(tmp_path: Path) -> None:
    t = v2(["main", None, "x"], [[], None, [0]])
    dest = write_trace(t, tmp_path / "t.parquet", TraceMeta(block_size=16))
    back = tree_columns(read_trace(dest)[0])
    assert back.column("agent_id").to_pylist() == ["main", "main", "x"]
    assert back.column("depends_on").to_pylist() == [[], [0], [0]]


def test_validator_accepts_a_fan_out_and_join() -> None:
    # 0 main spawns x (1) and y (2) in parallel; 3 is x's second turn; 4 joins x and y
    t = v2(
        ["main", "x", "y", "x", "main"],
        [[], [0], [0], [1], [0, 2, 3]],
        parent_index=[-1, -1, -1, 1, 0],
    )
    assert messages(t) == []


def test_validator_rejects_forward_cyclic_outside_and_broken_sequences() -> None:
    fwd = v2(["main", "main", "main"], [[], [2], [1]])
    assert any(
        "1:depends_on:depends on a request that does not arrive before it" in m
        for m in messages(fwd)
    )
    cyc = v2(["main", "main"], [[1], [0]], arrival_ns=[0, 0], parent_index=[-1, -1])
    assert any(
        m.startswith("0:depends_on:depends on a request that does not arrive before")
        for m in messages(cyc)
    )
    outside = v2(["main", "main"], [[], [7]])
    assert any(
        "1:depends_on:names a request_index the session does not have" in m
        for m in messages(outside)
    )
    # other session's request 0 does not count: session "t" has only request 1
    other = v2(
        ["main", "main"],
        [[], [0]],
        session_id=["s", "t"],
        request_index=[0, 1],
        parent_index=[-1, -1],
    )
    assert any("names a request_index the session does not have" in m for m in messages(other))
    broken = v2(["main", "x", "main"], [[], [0], [1]], parent_index=[-1, 0, -1])
    assert any(
        m.startswith("2:depends_on:does not depend on the previous turn of its agent_id")
        for m in messages(broken)
    )


def test_derive_depends_on_spawn_join_and_background() -> None:
    # arrivals (s): main 0, x 10 (ends 40), y 12 (ends 30), main 45 (joins x and y),
    # z 50 (runs to 200: outlives every later main turn), main 60
    agents = ["main", "x", "y", "main", "z", "main"]
    arrivals = [0, 10, 12, 45, 50, 60]
    ends = [5, 30, 18, 4, 150, 1]
    deps = derive_depends_on(agents, arrivals, ends)
    assert deps == [[], [0], [0], [0, 1, 2], [3], [3]]
    # z ends at 200 > 60: no join (background)
    assert think_after(45, deps[3], arrivals, ends) == 5  # latest dependency (x) ended at 40
    assert think_after(0, [], arrivals, ends) is None


def test_derive_depends_on_explicit_spawn_time_and_end() -> None:
    # the subagent's own turn arrives late (13) but it was spawned at 6, after main's 2nd turn
    agents = ["main", "main", "s", "main"]
    arrivals = [0, 5, 13, 20]
    deps = derive_depends_on(agents, arrivals, [1, 1, 1, 1], spawn_at={"s": 6}, agent_end={"s": 21})
    assert deps == [[], [0], [1], [1]]  # ends at 21 > 20: background
    deps = derive_depends_on(agents, arrivals, [1, 1, 1, 1], spawn_at={"s": 6}, agent_end={"s": 20})
    assert deps == [[], [0], [1], [1, 2]]
