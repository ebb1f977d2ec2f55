"""Traces for the GPU runs, made on the workstation and carried to the GPU machine.

    .venv/bin/python benchmarks/gpu/make_inputs.py slice IN.parquet OUT.parquet \
        --start 0 --window 240 --max-total 16000
    .venv/bin/python benchmarks/gpu/make_inputs.py fixed OUT.parquet \
        --requests 16 --input 2048 --output 256

``slice``: the requests of ``IN`` that arrive in ``[start, start + window)`` seconds and whose
prompt plus answer fit ``--max-total`` tokens (the server's context), arrivals rebased to
the window's start. A request whose parent was cut loses its parent (``parent_index -1``):
under ``--timing absolute`` the parent does not matter, under ``session`` it becomes a
session start.

``fixed``: the equivalent of ``vllm bench serve --dataset-name random`` with fixed lengths:
``--requests`` one-request sessions of exactly ``--input`` prompt and ``--output`` answer
tokens, all at time 0 (for ``--timing max-rate --concurrency C``), no prefix shared between
requests (every request gets its own hash ids).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_replay.traces.io import read_trace, write_trace  # noqa: E402
from agent_replay.traces.schema import TraceMeta  # noqa: E402

NS = 1_000_000_000


def slice_trace(
    src: str, dst: str, start_s: float, window_s: float, max_total: int, force: bool
) -> int:
    table, meta = read_trace(src)
    arrival = table.column("arrival_ns").to_numpy()
    total = table.column("input_tokens").to_numpy().astype(np.int64) + table.column(
        "output_tokens"
    ).to_numpy().astype(np.int64)
    lo, hi = int(start_s * NS), int((start_s + window_s) * NS)
    keep = (arrival >= lo) & (arrival < hi) & (total <= max_total)
    cut = table.filter(pa.array(keep))
    # parents that were cut: the child starts its own chain
    sess = cut.column("session_id").to_pylist()
    req = cut.column("request_index").to_numpy()
    parent = cut.column("parent_index").to_numpy().copy()
    present = set(zip(sess, req.tolist(), strict=True))
    for i, (s, p) in enumerate(zip(sess, parent.tolist(), strict=True)):
        if p >= 0 and (s, p) not in present:
            parent[i] = -1
    cut = cut.set_column(
        cut.schema.get_field_index("parent_index"), "parent_index", pa.array(parent, pa.int32())
    )
    if "think_ns" in cut.column_names:
        think = cut.column("think_ns")
        cut = cut.set_column(
            cut.schema.get_field_index("think_ns"),
            "think_ns",
            pc.if_else(pa.array(parent < 0), pa.nulls(len(cut), think.type), think),
        )
    cut = cut.set_column(
        cut.schema.get_field_index("arrival_ns"),
        "arrival_ns",
        pc.subtract(cut.column("arrival_ns"), pa.scalar(lo, pa.int64())),
    )
    meta.extra = {
        **meta.extra,
        "sliced_from": str(src),
        "slice_start_s": start_s,
        "slice_window_s": window_s,
        "slice_max_total_tokens": max_total,
    }
    write_trace(cut, dst, meta, force=force)
    return cut.num_rows


def fixed_trace(
    dst: str, requests: int, input_tokens: int, output_tokens: int, block_size: int, force: bool
) -> int:
    blocks = -(-input_tokens // block_size)
    hashes = [[(i << 20) + b + 1 for b in range(blocks)] for i in range(requests)]
    table = pa.table(
        {
            "session_id": pa.array([f"fixed-{i:05d}" for i in range(requests)]),
            "request_index": pa.array([0] * requests, pa.int32()),
            "parent_index": pa.array([-1] * requests, pa.int32()),
            "arrival_ns": pa.array([0] * requests, pa.int64()),
            "input_tokens": pa.array([input_tokens] * requests, pa.int32()),
            "output_tokens": pa.array([output_tokens] * requests, pa.int32()),
            "hash_ids": pa.array(hashes, pa.list_(pa.int64())),
            "api": pa.array(["completions"] * requests),
        }
    )
    meta = TraceMeta(
        block_size=block_size,
        source="synthetic",
        extra={
            "workload": f"fixed {input_tokens} in / {output_tokens} out, "
            "no shared prefix (vllm bench serve random dataset equivalent)"
        },
    )
    write_trace(table, dst, meta, force=force)
    return requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slice")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--start", type=float, default=0.0, help="window start, seconds")
    s.add_argument("--window", type=float, required=True, help="window length, seconds")
    s.add_argument(
        "--max-total",
        type=int,
        default=16000,
        help="drop requests whose input + output tokens exceed this",
    )
    s.add_argument("--force", action="store_true")
    f = sub.add_parser("fixed")
    f.add_argument("dst")
    f.add_argument("--requests", type=int, required=True)
    f.add_argument("--input", type=int, default=2048)
    f.add_argument("--output", type=int, default=256)
    f.add_argument("--block-size", type=int, default=16)
    f.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "slice":
        n = slice_trace(args.src, args.dst, args.start, args.window, args.max_total, args.force)
    else:
        n = fixed_trace(
            args.dst, args.requests, args.input, args.output, args.block_size, args.force
        )
    print(f"{args.dst}: {n} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
