"""Which sessions a replay cut to its first N sessions can use, found before the trace is
read whole: from the session and arrival columns only (``first_sessions``)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.traces.io import iter_batches, trace_files


def first_sessions(path: str | os.PathLike[str], n: int, *, skip_failed: bool) -> set[str] | None:
    """The sessions whose first request (leaving failed ones out with ``skip_failed``)
    arrives no later than the ``n``-th session's: a superset of the first ``n`` sessions
    by start, whatever ties and clones do to the order among them. None when the trace
    has no more than ``n`` sessions (all are needed)."""
    import pyarrow.parquet as pq

    cols = ["session_id", "arrival_ns"]
    if skip_failed and all("error" in pq.read_schema(f).names for f in trace_files(path)):
        cols.append("error")
    sids: list[pa.Array] = []
    arrivals: list[np.ndarray] = []
    for b in iter_batches(path, columns=cols):
        sid = b.column("session_id")
        if not pa.types.is_dictionary(sid.type):
            sid = sid.dictionary_encode()
        arr = np.asarray(b.column("arrival_ns").to_numpy(zero_copy_only=False)).astype(np.int64)
        if "error" in b.schema.names:
            ok = np.asarray(pc.is_null(b.column("error")).to_numpy(zero_copy_only=False), bool)
            sid, arr = sid.filter(pa.array(ok)), arr[ok]
        sids.append(sid)
        arrivals.append(arr)
    if not sids:
        return None
    # one dictionary for all batches: its indices are then session numbers
    col = pa.chunked_array(sids, sids[0].type).unify_dictionaries()
    if col.num_chunks == 0 or len(col) == 0:
        return None
    names = col.chunk(0).dictionary
    idx = np.concatenate([np.asarray(c.indices.fill_null(0).to_numpy(zero_copy_only=False))
                          for c in col.chunks]).astype(np.int64)
    valid = np.concatenate([np.asarray(c.is_valid().to_numpy(zero_copy_only=False), bool)
                            for c in col.chunks])
    arrival = np.concatenate(arrivals)[valid]
    idx = idx[valid]
    first = np.full(len(names), np.iinfo(np.int64).max, np.int64)
    if idx.size:  # the earliest arrival per session: sort by session, reduce each run
        order = np.argsort(idx, kind="stable")
        si, sa = idx[order], arrival[order]
        starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
        first[si[starts]] = np.minimum.reduceat(sa, starts)
    present = first < np.iinfo(np.int64).max
    if int(present.sum()) <= n:
        return None
    cut = np.partition(first[present], n - 1)[n - 1]
    keep = names.filter(pa.array(present & (first <= cut)))
    return {str(s) for s in keep.to_pylist()}
