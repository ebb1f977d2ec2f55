"""Mooncake JSONL (kvcache-ai/Mooncake FAST'25 traces): one object per line,
``{timestamp (ms from start), input_length, output_length, hash_ids}``, 512-token blocks,
each hash covering its block and every block before it.

Sessions are not in the file; they are inferred from hash-prefix chains:

* A request's *context key* is the hash of its last full block
  (``hash_ids[input_length // 512 - 1]``): it names the request's whole prompt up to that
  block.
* A later request continues an earlier one when its own hash list contains that key at
  the same position, i.e. its prompt starts with the earlier prompt's full blocks, it
  matches at least ``MIN_CHAIN_BLOCKS`` blocks, and it extends the earlier one by at least
  one block (more hash ids: the conversation continued; two prompts of the same length
  that share blocks share a system prompt and are not linked). The parent is the request
  with the longest such match (the most recent one on ties).
* A key held by more than ``MAX_CHILDREN`` continuations is a shared system prompt, not
  a conversation, and stops linking. Everything else starts a new session.

Timestamps are milliseconds (the public trace is quantized to ~3 s ticks), so think times
are unknown: ``think_ns`` is left null and the original arrival gap is kept in
``arrival_ns``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from agent_replay.traces.builder import concat
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    first_json_object,
    get_hash_ids,
    get_int,
    read_jsonl,
)
from agent_replay.traces.io import conform
from agent_replay.traces.schema import TraceMeta

NAME = "mooncake"
BLOCK_SIZE = 512
MIN_CHAIN_BLOCKS = 2
MAX_CHILDREN = 4


def sniff(path: Path, head: bytes) -> bool:
    obj = first_json_object(head)
    return (
        obj is not None
        and {"timestamp", "input_length", "output_length"} <= obj.keys()
        and "chat_id" not in obj
    )


def infer_sessions(hash_lists: list[list[int]], inputs: list[int], block_size: int) -> list[int]:
    """Parent row (or -1) of each row, by the heuristic in the module docstring. Rows must
    be in arrival order."""
    key_owner: dict[int, int] = {}  # context key -> latest row whose context it is
    key_pos: dict[int, int] = {}
    children: dict[int, int] = {}
    parents: list[int] = []
    for row, (ids, n_in) in enumerate(zip(hash_lists, inputs, strict=True)):
        full = min(n_in // block_size, len(ids))
        parent = -1
        for j in range(full - 1, MIN_CHAIN_BLOCKS - 2, -1):
            owner = key_owner.get(ids[j])
            # a continuation extends its parent by at least one block: same-length prompts
            # that share full blocks are siblings on a shared prompt, not a conversation
            if (
                owner is not None
                and key_pos[ids[j]] == j
                and children.get(ids[j], 0) < MAX_CHILDREN
                and len(ids) >= len(hash_lists[owner]) + 1
            ):
                parent = owner
                children[ids[j]] = children.get(ids[j], 0) + 1
                break
        parents.append(parent)
        if full >= 1:
            k = ids[full - 1]
            if k not in key_owner or key_pos[k] == full - 1:
                key_owner[k] = row
                key_pos[k] = full - 1
    return parents


def _read_rows(path: Path) -> tuple[list[int], list[int], list[int], list[list[int] | None]]:
    """(timestamps, input lengths, output lengths, hash ids) of the file's rows, in
    arrival order (file order on ties)."""
    ts: list[int] = []
    ins: list[int] = []
    outs: list[int] = []
    hashes: list[list[int] | None] = []
    for line, obj in read_jsonl(path):
        ts.append(get_int(obj, "timestamp", path, line))
        ins.append(get_int(obj, "input_length", path, line))
        outs.append(get_int(obj, "output_length", path, line))
        hashes.append(get_hash_ids(obj, path, line))
    if not ts:
        raise fail(path, None, "no requests in file")
    if any(ts[i + 1] < ts[i] for i in range(len(ts) - 1)):
        order = sorted(range(len(ts)), key=lambda i: (ts[i], i))
        ts, ins, outs, hashes = ([x[i] for i in order] for x in (ts, ins, outs, hashes))  # type: ignore[assignment]
    return ts, ins, outs, hashes


def _sessions(parents: list[int]) -> tuple[list[int], list[int]]:
    """(session, request index) of each row from its parent row (-1: a new session,
    numbered by its first row)."""
    session = [0] * len(parents)
    index = [0] * len(parents)
    counts: dict[int, int] = {}
    for row, p in enumerate(parents):
        s = session[p] if p >= 0 else row
        session[row] = s
        index[row] = counts.get(s, 0)
        counts[s] = index[row] + 1
    return session, index


def _load_one(path: Path, opts: ImportOptions, file_tag: str) -> pa.Table:
    ts, ins, outs, hashes = _read_rows(path)
    bs = opts.block_size or BLOCK_SIZE
    if opts.infer_sessions:
        parents = infer_sessions([h or [] for h in hashes], ins, bs)
    else:
        parents = [-1] * len(ts)
    session, index = _sessions(parents)
    t0 = ts[0]
    table = pa.table(
        {
            "session_id": pa.array(
                [f"{file_tag}{s}" for s in session], pa.string()
            ).dictionary_encode(),
            "request_index": pa.array(index, pa.int32()),
            "parent_index": pa.array([index[p] if p >= 0 else -1 for p in parents], pa.int32()),
            "arrival_ns": pa.array([(t - t0) * 1_000_000 for t in ts], pa.int64()),
            "input_tokens": pa.array(ins, pa.int32()),
            "output_tokens": pa.array(outs, pa.int32()),
            "hash_ids": pa.array(hashes, pa.list_(pa.int64())),
        }
    )
    return conform(table)


def block_size_of(paths: list[Path]) -> int | None:
    """The block size the files' hash ids were made over: the one power of two B for which
    every row with hash ids has ceil(input_length / B) of them (a trace exported by ``traces
    convert`` with its own block size, say); None when no B fits every row (or none has
    hash ids)."""
    lengths = [_lengths(obj) for path in paths for _, obj in read_jsonl(path)]
    pairs = np.array([p for p in lengths if p is not None], dtype=np.int64).reshape(-1, 2)
    fits = [b for b in (2**k for k in range(15)) if _fits(pairs, b)]
    if BLOCK_SIZE in fits:
        return BLOCK_SIZE
    return fits[0] if len(fits) == 1 else None


def _fits(pairs: np.ndarray, block: int) -> bool:
    """Every (input_length, hash-id count) pair has ceil(input_length / block) ids."""
    return bool(pairs.size) and np.array_equal(-(-pairs[:, 0] // block), pairs[:, 1])


def _lengths(obj: dict[str, Any]) -> tuple[int, int] | None:
    """(input_length, number of hash ids) of a row that has both."""
    h, n = obj.get("hash_ids"), obj.get("input_length")
    return (n, len(h)) if isinstance(h, list) and isinstance(n, int) else None


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    inferred = None if opts.block_size else block_size_of(paths)
    read = inferred not in (None, BLOCK_SIZE)
    if read:
        opts = replace(opts, block_size=inferred)
    tables = [_load_one(p, opts, f"{p.stem}-" if len(paths) > 1 else "mc-") for p in paths]
    bs = opts.block_size or BLOCK_SIZE
    meta = TraceMeta(
        block_size=bs, source=f"imported:{NAME}", extra={"imported_from": [p.name for p in paths]}
    )
    notes = [
        "sessions inferred from hash-prefix chains"
        if opts.infer_sessions
        else "one session per request",
        "timestamps are milliseconds; think times unknown (null)",
    ]
    if read:
        notes.append(
            f"block size {inferred} tokens, read from the hash ids' lengths "
            "(--block-size overrides it)"
        )
    return ImportResult(concat(tables), meta, NAME, notes)
