"""Export a trace as Mooncake-style JSONL, so that other tools can replay it:
``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` per line, in arrival
order. Import goes the other way through ``traces.importers.mooncake``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from traces.errors import OutputExistsError
from traces.hashing import extend_hashes
from traces.schema import TraceMeta


def to_mooncake_lines(table: pa.Table, meta: TraceMeta) -> list[bytes]:
    """One JSON line per request. Rows without hashes get fresh, unshared ids."""
    order = np.argsort(table.column("arrival_ns").to_numpy(), kind="stable")
    t = table.take(pa.array(order))
    arrival = t.column("arrival_ns").to_pylist()
    ins = t.column("input_tokens").to_pylist()
    outs = t.column("output_tokens").to_pylist()
    hashes = t.column("hash_ids").to_pylist()
    lines = []
    for i, (a, n_in, n_out, h) in enumerate(zip(arrival, ins, outs, hashes, strict=True)):
        ids = h if h is not None else extend_hashes([], -(-n_in // meta.block_size), f"row{i}")
        lines.append(orjson.dumps({"timestamp": a // 1_000_000, "input_length": n_in,
                                   "output_length": n_out, "hash_ids": ids}) + b"\n")
    return lines


def write_mooncake(table: pa.Table, meta: TraceMeta, path: str | os.PathLike[str], *,
                   force: bool = False) -> Path:
    """Write atomically; refuses to overwrite unless ``force``."""
    dest = Path(path)
    if dest.exists() and not force:
        raise OutputExistsError(str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.writelines(to_mooncake_lines(table, meta))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
