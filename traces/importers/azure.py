"""Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024):
CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` with wall-clock timestamps carrying 100 ns
digits. No sessions and no prefix hashes: every request is its own session; the exact
timestamps are kept to the nanosecond.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from agent_replay.traces.builder import concat
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    parse_iso_ns,
    read_csv,
)
from agent_replay.traces.io import conform
from agent_replay.traces.schema import TraceMeta

NAME = "azure"
HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def sniff(path: Path, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip().lstrip("\ufeff")
    return tuple(c.strip() for c in first.split(",")) == HEADER


def _int(cell: str, path: Path, line: int, name: str) -> int:
    try:
        v = int(cell)
    except ValueError as exc:
        raise fail(path, line, f"field {name!r} must be an integer, got {cell!r}") from exc
    if v < 0:
        raise fail(path, line, f"field {name!r} must be >= 0, got {v}")
    return v


def _load_one(path: Path, tag: str) -> tuple[pa.Table, int]:
    header, rows = read_csv(path)
    if tuple(header) != HEADER:
        raise fail(path, 1, f"expected header {','.join(HEADER)}, got {','.join(header)}")
    ts: list[int] = []
    ins: list[int] = []
    outs: list[int] = []
    for line, cells in rows:
        if len(cells) != 3:
            raise fail(path, line, f"expected 3 fields, got {len(cells)}")
        ts.append(parse_iso_ns(cells[0], path, line, "TIMESTAMP"))
        ins.append(_int(cells[1], path, line, "ContextTokens"))
        outs.append(_int(cells[2], path, line, "GeneratedTokens"))
    if not ts:
        raise fail(path, None, "no requests in file")
    order = sorted(range(len(ts)), key=lambda i: (ts[i], i))
    t0 = ts[order[0]]
    n = len(ts)
    table = pa.table(
        {
            "session_id": pa.array(
                [f"{tag}{i}" for i in range(n)], pa.string()
            ).dictionary_encode(),
            "request_index": pa.array([0] * n, pa.int32()),
            "parent_index": pa.array([-1] * n, pa.int32()),
            "arrival_ns": pa.array([ts[i] - t0 for i in order], pa.int64()),
            "input_tokens": pa.array([ins[i] for i in order], pa.int32()),
            "output_tokens": pa.array([outs[i] for i in order], pa.int32()),
        }
    )
    return conform(table), t0


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    parts = [_load_one(p, f"{p.stem}-" if len(paths) > 1 else "az-") for p in paths]
    meta = TraceMeta(
        block_size=opts.block_size or 16,
        source=f"imported:{NAME}",
        start_wall_ns=parts[0][1],
        extra={"imported_from": [p.name for p in paths]},
    )
    return ImportResult(
        concat(t for t, _ in parts),
        meta,
        NAME,
        ["no sessions in source: one session per request", "no prefix hashes"],
    )
